/* Text without printf for the runner's messages (log and error records): the firmware links no
 * printf (the lean libc), and these few appends are all the messages need. Shared by the runner
 * and the Ethos-U glue. */
#ifndef DK_RUNNER_TEXT_H
#define DK_RUNNER_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* Appends to a caller's buffer of `cap` bytes, always NUL-terminated, truncating when full. */
class Text {
 public:
  Text(char *buf, size_t cap) : buf_(buf), cap_(cap) { buf_[0] = '\0'; }
  Text &operator<<(const char *s) {
    while (s && *s && len_ + 1 < cap_) buf_[len_++] = *s++;
    buf_[len_] = '\0';
    return *this;
  }
  Text &operator<<(uint32_t v) { return dec(v); }
  Text &dec(uint32_t v) {
    char d[10];
    size_t n = 0;
    do {
      d[n++] = static_cast<char>('0' + v % 10u);
      v /= 10u;
    } while (v && n < sizeof d);
    while (n && len_ + 1 < cap_) buf_[len_++] = d[--n];
    buf_[len_] = '\0';
    return *this;
  }
  Text &hex(uint32_t v) {
    static const char kDigits[] = "0123456789ABCDEF";
    *this << "0x";
    for (int shift = 28; shift >= 0 && len_ + 1 < cap_; shift -= 4)
      buf_[len_++] = kDigits[(v >> shift) & 0xFu];
    buf_[len_] = '\0';
    return *this;
  }
  const char *c_str() const { return buf_; }
  size_t size() const { return len_; }

 private:
  char *buf_;
  size_t cap_;
  size_t len_ = 0;
};

/* A Text with a buffer of its own (the storage base is constructed before Text). */
template <size_t N>
struct TextStorage {
  char storage[N] = {};
};

template <size_t N>
class TextLine : private TextStorage<N>, public Text {
 public:
  TextLine() : TextStorage<N>(), Text(this->storage, N) {}
};

#endif /* DK_RUNNER_TEXT_H */
