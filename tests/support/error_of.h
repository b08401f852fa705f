// The message of the exception a callable throws ("" when it throws none), for tests that
// check what an error names.
#pragma once
#include <exception>
#include <string>

namespace flexh2o::testing {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace flexh2o::testing
