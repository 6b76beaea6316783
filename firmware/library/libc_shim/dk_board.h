/* The one board service firmware/runner/lean_libc.cpp needs, for a library component (no board
 * support, no result protocol): stopping, through the application's dk_abort_handler(). */
#ifndef DK_LIBRARY_SHIM_BOARD_H
#define DK_LIBRARY_SHIM_BOARD_H

#ifdef __cplusplus
extern "C" {
#endif
__attribute__((noreturn)) void dk_abort_handler(int code);
#ifdef __cplusplus
}
#endif

static inline __attribute__((noreturn)) void dk_exit(int status) { dk_abort_handler(status); }

#endif /* DK_LIBRARY_SHIM_BOARD_H */
