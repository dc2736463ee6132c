// core/error.h: fusegrad's error policy in code. Host code throws fg::Error; nothing in a library
// calls exit(). FG_CHECK is for the caller's bad input and names the op in brackets:
//   FG_CHECK(w.numel() == n, "rmsnorm", "weight has ", w.numel(), " elements, rows have ", n);
//   -> fg::Error("[rmsnorm] weight has 32 elements, rows have 64")
// FG_ASSERT is for fusegrad's own invariants ("internal error: ...").
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fg {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}
}  // namespace detail

template <typename... Parts>
[[noreturn]] void fail(const char* op, const Parts&... parts) {
    throw Error(detail::concat("[", op, "] ", parts...));
}

}  // namespace fg

#define FG_CHECK(cond, op, ...)                       \
    do {                                              \
        if (!(cond)) ::fg::fail(op, __VA_ARGS__);     \
    } while (0)

#define FG_ASSERT(cond, ...)                                                              \
    do {                                                                                  \
        if (!(cond))                                                                      \
            throw ::fg::Error(::fg::detail::concat("internal error: ", #cond, " at ",      \
                                                   __FILE__, ":", __LINE__, ": ", __VA_ARGS__)); \
    } while (0)
