// Catch2 entry point for pi0_tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
