# Included when PI0_DEPS_DIR is set: a folder holding Debian packages unpacked with `dpkg -x` (made by
# scripts/fetch_deps.sh) is searched before the system for every header, library and CMake package config.
# The unpacked tree keeps Debian's layout (usr/include, usr/lib/x86_64-linux-gnu, hdf5/serial sub-folders).
set(_deps "${PI0_DEPS_DIR}/usr")
if(NOT EXISTS "${_deps}/include")
  message(FATAL_ERROR "PI0_DEPS_DIR=${PI0_DEPS_DIR} holds no usr/include: run scripts/fetch_deps.sh ${PI0_DEPS_DIR} first")
endif()
set(_arch_lib "${_deps}/lib/x86_64-linux-gnu")
list(PREPEND CMAKE_PREFIX_PATH "${_deps}")
list(PREPEND CMAKE_INCLUDE_PATH "${_deps}/include" "${_deps}/include/hdf5/serial")
list(PREPEND CMAKE_LIBRARY_PATH "${_arch_lib}" "${_arch_lib}/hdf5/serial")
# HDF5 (serial, Debian layout): found here directly; the top-level CMakeLists skips FindHDF5, which prefers the
# h5cc wrapper whose paths point into the system.
find_path(HDF5_C_INCLUDE_DIR hdf5.h PATHS "${_deps}/include/hdf5/serial" NO_DEFAULT_PATH REQUIRED)
find_library(HDF5_C_LIBRARY_hdf5 NAMES hdf5_serial hdf5 PATHS "${_arch_lib}/hdf5/serial" "${_arch_lib}" NO_DEFAULT_PATH
             REQUIRED)
# The unpacked shared libraries depend on each other (libhdf5 → libsz, libcurl …): let the linker find them there.
set(CMAKE_EXE_LINKER_FLAGS "${CMAKE_EXE_LINKER_FLAGS} -Wl,-rpath-link,${_arch_lib} -Wl,-rpath,${_arch_lib}:${_arch_lib}/hdf5/serial")
set(CMAKE_SHARED_LINKER_FLAGS "${CMAKE_SHARED_LINKER_FLAGS} -Wl,-rpath-link,${_arch_lib} -Wl,-rpath,${_arch_lib}")
message(STATUS "pi0: third-party packages from ${PI0_DEPS_DIR}")
