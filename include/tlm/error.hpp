#pragma once
// Every failure on bad input is a tlm::error (or a subclass), never an abort.
// A message names what was wrong, where it was found, and what to do about it.
#include <stdexcept>
#include <string>

namespace tlm {

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A file that is not a well-formed GGUF file (truncated, corrupt, unsupported).
struct format_error : error {
  using error::error;
};

// A well-formed file whose model does not fit the config type it is bound to.
struct model_mismatch : error {
  using error::error;
};

// A tensor whose run-time size or encoding does not fit its compile-time shape.
struct shape_error : error {
  using error::error;
};

// A KV-cache write past its capacity, or a prompt past the model's context.
struct capacity_error : error {
  using error::error;
};

// Text the tokenizer cannot take (for example invalid UTF-8).
struct text_error : error {
  using error::error;
};

// Non-finite values in training: a NaN or infinity in a loss or gradient.
struct numeric_error : error {
  using error::error;
};

}  // namespace tlm
