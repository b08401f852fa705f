// The flags of the options the libraries name by meaning (kernels/option_error.h): an error
// from below the CLI is said with the flag the user typed.
#pragma once
#include <exception>
#include <string>

#include "kernels/option_error.h"

namespace flexh2o::cli {

// "--gen-len", "--kv", ...
std::string flag_of(kernels::Option o);

// What `e` says, each option it names (an OptionText) named by its flag.
std::string error_text(const std::exception& e);

}  // namespace flexh2o::cli
