/*
 * lean_libc.cpp: the few C and C++ runtime services the runner's ExecuTorch code reaches for,
 * without newlib's heavyweight versions. Linked by the size and speed build profiles
 * (DK_LEAN_LIBC=ON, docs/profiles.md); the results are the same, the code is ~4 KB smaller.
 *
 * - snprintf / vsnprintf. With logging compiled out, ExecuTorch formats only operator names
 *   ("%s%s%s", Method::init) and tag names ("%s", "%d"); newlib-nano's snprintf brings its
 *   printf core plus malloc and realloc. This one does %s %c %d %i %u %x %X %p %% with the
 *   hh/h/l/ll/z/j/t length modifiers, a width, a precision for %s, and the 0 and - flags; any
 *   other conversion writes '?'. It always NUL-terminates and returns the untruncated length,
 *   as C requires.
 * - strcmp, memmove: byte loops (ExecuTorch calls them while loading, not in execute()).
 * - abort(): an `error` record (DK_ERR_ABORT, as et_pal_abort) and done(1), instead of newlib's
 *   SIGABRT machinery (raise, signal, _kill).
 * - __aeabi_atexit / __cxa_atexit: the runner never returns from main() (it ends in dk_exit),
 *   so static destructors never run; registering them is dead code.
 * - operator delete: nothing is allocated with new (et_pal_allocate returns null, the pools
 *   are static), but virtual destructors' deleting variants reference it, which pulls in
 *   free() and malloc(). Reaching it is reported like abort().
 * - With DK_LEAN_LIBC_HANDLE_POOL=1 (a library component with ExecuTorch's EthosUBackend,
 *   firmware/library/ethos_u.cmake): operator new(size_t, std::nothrow_t) from a small pool of
 *   fixed slots, and operator delete giving a pool slot back. EthosUBackend::init allocates one
 *   ExecutionHandle (two pointers) per delegate with new (std::nothrow), and destroy() deletes
 *   it when the application reloads the model (dk_<model>_init() again), so the slots are
 *   reused; deleting anything else is still reported like abort(). (The runner never unloads a
 *   method: its NPU glue serves the handles from a bump arena, firmware/runner/npu_ethos_u.cpp.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#if DK_LEAN_LIBC_HANDLE_POOL
#include <new>
#endif

#include "dk_board.h"
#include "dk_errors.h"
#include "dk_protocol.h"

namespace {

constexpr uint32_t kErrAbort = DK_ERR_ABORT;

[[noreturn]] void report_abort(const char *what) {
  dk_send_error(kErrAbort, what);
  dk_send_done(DK_STATUS_ET_ERROR);
  dk_exit(static_cast<int>(DK_STATUS_ET_ERROR));
}

class Out {
 public:
  Out(char *buf, size_t cap) : buf_(buf), cap_(cap) {}
  void put(char c) {
    if (len_ + 1 < cap_) buf_[len_] = c;
    ++len_;
  }
  void pad(size_t n, char c) {
    while (n--) put(c);
  }
  int finish() {
    if (cap_) buf_[len_ < cap_ ? len_ : cap_ - 1] = '\0';
    return static_cast<int>(len_);
  }

 private:
  char *buf_;
  size_t cap_;
  size_t len_ = 0;
};

void put_field(Out &out, const char *s, size_t n, size_t width, bool left, char fill) {
  const size_t padding = width > n ? width - n : 0;
  if (!left) out.pad(padding, fill);
  for (size_t i = 0; i < n; ++i) out.put(s[i]);
  if (left) out.pad(padding, ' ');
}

}  // namespace

extern "C" {

int vsnprintf(char *buf, size_t size, const char *fmt, va_list ap) {
  Out out(buf, size);
  while (*fmt) {
    if (*fmt != '%') {
      out.put(*fmt++);
      continue;
    }
    ++fmt;
    bool left = false, zero = false;
    for (;; ++fmt) {
      if (*fmt == '-') left = true;
      else if (*fmt == '0') zero = true;
      else break;
    }
    size_t width = 0;
    if (*fmt == '*') {
      const int w = va_arg(ap, int);
      width = w > 0 ? static_cast<size_t>(w) : 0;
      ++fmt;
    }
    while (*fmt >= '0' && *fmt <= '9') width = width * 10 + static_cast<size_t>(*fmt++ - '0');
    size_t precision = SIZE_MAX;
    if (*fmt == '.') {
      ++fmt;
      precision = 0;
      if (*fmt == '*') {
        const int p = va_arg(ap, int);
        precision = p >= 0 ? static_cast<size_t>(p) : SIZE_MAX;
        ++fmt;
      }
      while (*fmt >= '0' && *fmt <= '9') precision = precision * 10 + static_cast<size_t>(*fmt++ - '0');
    }
    int longs = 0;  // 0: int, 1: long, 2: long long (and 64-bit z/j/t are not on this target)
    while (*fmt == 'h' || *fmt == 'l' || *fmt == 'z' || *fmt == 'j' || *fmt == 't') {
      if (*fmt == 'l') ++longs;
      if (*fmt == 'j') longs = 2;
      ++fmt;
    }
    const char conv = *fmt ? *fmt++ : '\0';
    char digits[24];
    switch (conv) {
      case '%':
        out.put('%');
        break;
      case 'c': {
        const char c = static_cast<char>(va_arg(ap, int));
        put_field(out, &c, 1, width, left, ' ');
        break;
      }
      case 's': {
        const char *s = va_arg(ap, const char *);
        if (s == nullptr) s = "(null)";
        size_t n = 0;
        while (n < precision && s[n]) ++n;
        put_field(out, s, n, width, left, ' ');
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'p': {
        uint64_t v;
        bool negative = false;
        if (conv == 'p') {
          v = reinterpret_cast<uintptr_t>(va_arg(ap, void *));
        } else if (conv == 'd' || conv == 'i') {
          const int64_t s = longs >= 2 ? va_arg(ap, long long)
                            : longs == 1 ? va_arg(ap, long) : va_arg(ap, int);
          negative = s < 0;
          v = negative ? 0u - static_cast<uint64_t>(s) : static_cast<uint64_t>(s);
        } else {
          v = longs >= 2 ? va_arg(ap, unsigned long long)
              : longs == 1 ? va_arg(ap, unsigned long) : va_arg(ap, unsigned int);
        }
        const char *alphabet = conv == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
        size_t n = 0;
        if (conv == 'd' || conv == 'i' || conv == 'u') {
          // Decimal by subtracting powers of ten: no 64-bit division (libgcc's __udivmoddi4
          // alone is ~750 B).
          uint64_t powers[20];
          size_t places = 0;
          for (uint64_t p = 1;; p *= 10u) {
            powers[places++] = p;
            if (places == 20 || p * 10u > v) break;  // 10^19 is the last below 2^64
          }
          while (places) {
            const uint64_t p = powers[--places];
            char d = '0';
            while (v >= p) {
              v -= p;
              ++d;
            }
            digits[n++] = d;
          }
          for (size_t i = n; i--;) digits[sizeof digits - n + i] = digits[i];
        } else {
          do {
            digits[sizeof digits - 1 - n++] = alphabet[v & 15u];
            v >>= 4;
          } while (v);
        }
        if (conv == 'p') {
          digits[sizeof digits - 1 - n++] = 'x';
          digits[sizeof digits - 1 - n++] = '0';
        }
        if (negative && zero && !left) {
          out.put('-');
          width = width ? width - 1 : 0;
        } else if (negative) {
          digits[sizeof digits - 1 - n++] = '-';
        }
        put_field(out, digits + sizeof digits - n, n, width, left, zero && !left ? '0' : ' ');
        break;
      }
      default:
        out.put('?');  // a conversion this build never needs (floats, %n, ...)
        break;
    }
  }
  return out.finish();
}

// Small versions of the string functions ExecuTorch calls at load time only (kernel lookup,
// tensor resizing): newlib's strcmp for this core is an unrolled 442 B, memmove 254 B.
int strcmp(const char *a, const char *b) {
  while (*a && *a == *b) {
    ++a;
    ++b;
  }
  return static_cast<unsigned char>(*a) - static_cast<unsigned char>(*b);
}

void *memmove(void *dst, const void *src, size_t n) {
  unsigned char *d = static_cast<unsigned char *>(dst);
  const unsigned char *s = static_cast<const unsigned char *>(src);
  if (d < s) {
    while (n--) *d++ = *s++;
  } else {
    while (n--) d[n] = s[n];
  }
  return dst;
}

int snprintf(char *buf, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(buf, size, fmt, ap);
  va_end(ap);
  return n;
}

void abort(void) { report_abort("abort() called"); }

int __aeabi_atexit(void *, void (*)(void *), void *) { return 0; }
int __cxa_atexit(void (*)(void *), void *, void *) { return 0; }

}  // extern "C"

#if DK_LEAN_LIBC_HANDLE_POOL
namespace std {
// The tag new (std::nothrow) passes, which libsupc++ defines: a C application is linked without
// it. Weak, so that a C++ application's libsupc++ definition wins.
__attribute__((weak)) extern const nothrow_t nothrow{};
}  // namespace std

namespace {
constexpr size_t kHandleSlot = 16u;   // an ExecutionHandle is 8 bytes on 32-bit Arm
constexpr uint32_t kHandleSlots = 16u;  // delegates of all the models loaded at once
alignas(8) uint8_t handle_pool[kHandleSlots][kHandleSlot];
uint32_t handles_used;  // one bit per slot

bool release_handle(void *p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = reinterpret_cast<uintptr_t>(handle_pool);
  if (at < start || at >= start + sizeof handle_pool || (at - start) % kHandleSlot != 0u)
    return false;
  handles_used &= ~(1u << ((at - start) / kHandleSlot));
  return true;
}
}  // namespace

void *operator new(size_t size, const std::nothrow_t &) noexcept {
  if (size > kHandleSlot) return nullptr;  // the delegate's init fails: MemoryAllocationFailed
  for (uint32_t i = 0; i < kHandleSlots; ++i) {
    if (!(handles_used & (1u << i))) {
      handles_used |= 1u << i;
      return handle_pool[i];
    }
  }
  return nullptr;
}

void operator delete(void *p) noexcept {
  if (p == nullptr || release_handle(p)) return;
  report_abort("operator delete called (no heap)");
}
void operator delete(void *p, size_t) noexcept { operator delete(p); }
#else
void operator delete(void *) noexcept { report_abort("operator delete called (no heap)"); }
void operator delete(void *, size_t) noexcept {
  report_abort("operator delete called (no heap)");
}
#endif
