# Makes every binary of ours bind the C++ standard library's symbols to libstdc++, never to the copies that pip's
# LibTorch 2.x exports (all of std::filesystem, some std::string and string-stream members; a call bound to one
# crashed, issue 22). How depends on how the toolchain links libstdc++, which a probe program decides at configure:
# - shared (Debian's g++): libstdc++.so named first, in the link options that precede every library, so that the
#   dynamic loader looks a symbol up there before LibTorch;
# - static (the GPU machine's /opt/gcc g++, or -static-libstdc++ in the flags): the driver appends libstdc++.a after
#   LibTorch, so an archive member is only pulled for a symbol LibTorch has not already defined, and our calls bind to
#   LibTorch's copies (issue 47, item 4). Naming the archive right after our own static library, ahead of LibTorch,
#   pulls the members our objects need before the linker reaches LibTorch.
# scripts/check_std_bindings.sh (the ctest std_symbol_bindings) proves either way on the built binaries.
#
# pi0_bind_stdcxx_first(TARGET) applies it to TARGET (a static library: the items travel to whatever links it) and
# sets PI0_STDCXX_LINKAGE (shared | static) in the caller's scope.
function(pi0_bind_stdcxx_first target)
  set(dir "${CMAKE_BINARY_DIR}/stdcxx_probe")
  file(WRITE "${dir}/probe.cpp"
       "#include <string>\nint main(int argc, char**) { std::string s(static_cast<unsigned>(argc), 'x');\n"
       "  return static_cast<int>(s.size()) - 1; }\n")
  # try_compile uses CMAKE_CXX_FLAGS and CMAKE_EXE_LINKER_FLAGS (CMP0056), so a -static-libstdc++ there counts.
  try_compile(_ok "${dir}/build" "${dir}/probe.cpp" CXX_STANDARD 17 COPY_FILE "${dir}/probe"
              OUTPUT_VARIABLE _log)
  if(NOT _ok)
    message(FATAL_ERROR "pi0: cannot link a C++ probe program with ${CMAKE_CXX_COMPILER}:\n${_log}")
  endif()
  set(_objdump "${CMAKE_OBJDUMP}")
  if(NOT _objdump)
    find_program(_objdump objdump REQUIRED)
  endif()
  execute_process(COMMAND "${_objdump}" -p "${dir}/probe" OUTPUT_VARIABLE _headers RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pi0: ${_objdump} -p ${dir}/probe failed (${_rc}): cannot tell how libstdc++ is linked")
  endif()
  if(_headers MATCHES "NEEDED +libstdc\\+\\+\\.so")
    set(linkage shared)
    target_link_options(${target} INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
  else()
    set(linkage static)
    target_link_libraries(${target} PUBLIC "-Wl,--push-state,-Bstatic,-lstdc++,--pop-state")
  endif()
  set(PI0_STDCXX_LINKAGE ${linkage} PARENT_SCOPE)
  message(STATUS "pi0: libstdc++ linked ${linkage} by ${CMAKE_CXX_COMPILER}; bound ahead of LibTorch's std:: copies")
endfunction()
