/* syscalls.c: the newlib system calls a bare-metal program needs, plus the start-file symbols
 * that -nostartfiles leaves out (_init, _fini, __dso_handle). stdout/stderr go to the console;
 * the heap (_sbrk) is the DK_HEAP block reserved by sections.ld and never grows past it. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "dk_board.h"

extern uint8_t __dk_heap_start[];
extern uint8_t __dk_heap_end[];

static uint8_t *dk_brk = __dk_heap_start;
static size_t dk_brk_max;

/* Declarations (newlib has no public prototypes for these). */
void *_sbrk(ptrdiff_t incr);
int _write(int fd, const void *buf, size_t len);
int _read(int fd, void *buf, size_t len);
int _close(int fd);
int _fstat(int fd, struct stat *st);
int _isatty(int fd);
int _lseek(int fd, int offset, int whence);
void _exit(int status);
int _kill(int pid, int sig);
int _getpid(void);
void _init(void);
void _fini(void);
size_t dk_sbrk_high_water(void);

void *_sbrk(ptrdiff_t incr) {
  uint8_t *old = dk_brk;
  const uintptr_t avail = (uintptr_t)__dk_heap_end - (uintptr_t)old;
  const uintptr_t used = (uintptr_t)old - (uintptr_t)__dk_heap_start;
  if ((incr > 0 && (uintptr_t)incr > avail) || (incr < 0 && (uintptr_t)(-incr) > used)) {
    errno = ENOMEM;
    return (void *)-1;
  }
  dk_brk = old + incr;
  const size_t now = (size_t)((uintptr_t)dk_brk - (uintptr_t)__dk_heap_start);
  if (now > dk_brk_max) dk_brk_max = now;
  return old;
}

size_t dk_sbrk_high_water(void) { return dk_brk_max; }

int _write(int fd, const void *buf, size_t len) {
  if (fd != 1 && fd != 2) {
    errno = EBADF;
    return -1;
  }
  dk_console_write(buf, len);
  return (int)len;
}

int _read(int fd, void *buf, size_t len) {
  if (fd != 0) {
    errno = EBADF;
    return -1;
  }
  return (int)dk_console_read(buf, len);
}

int _close(int fd) {
  (void)fd;
  errno = EBADF;
  return -1;
}

int _fstat(int fd, struct stat *st) {
  (void)fd;
  st->st_mode = S_IFCHR;
  return 0;
}

int _isatty(int fd) { return fd >= 0 && fd <= 2; }

int _lseek(int fd, int offset, int whence) {
  (void)fd;
  (void)offset;
  (void)whence;
  return 0;
}

void _exit(int status) { dk_exit(status); }

int _kill(int pid, int sig) {
  (void)pid;
  (void)sig;
  errno = EINVAL;
  return -1;
}

int _getpid(void) { return 1; }

void _init(void) {}
void _fini(void) {}

/* crtbegin.o normally defines it; C++ static destructors registered with __cxa_atexit use it. */
__attribute__((weak)) void *__dso_handle = 0;
