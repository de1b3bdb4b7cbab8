// Error conventions (docs/ARCHITECTURE.md "Errors"):
//  - dsv41::Error: expected failures (bad file, bad config, bad request). Thrown during start-up
//    and by CLI tools, caught once in main (one precise message, exit code 1); request paths turn
//    it into an OpenAI error object. The message names the file / tensor / field at fault.
//  - DSV_ASSERT: internal invariants; stays on in release builds, logs file:line, aborts.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dsv41 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace dsv41

// Throws dsv41::Error with a formatted message when cond is false.
#define DSV_CHECK(cond, ...)                      \
  do {                                            \
    if (!(cond)) ::dsv41::fail(__VA_ARGS__);      \
  } while (0)

// Internal invariant: on in release builds; aborts with file:line.
#define DSV_ASSERT(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) ::dsv41::assert_fail(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)
