// Compiles nothing: the library test_pch exists so that Meson builds tests/pch/test_pch.h's
// precompiled header with exactly the test sources' flags (tests/meson.build).
