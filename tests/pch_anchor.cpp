// The one source of qshard_test_pch (tests/CMakeLists.txt), the target whose precompiled header
// every test executable reuses.
