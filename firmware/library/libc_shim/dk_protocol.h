/* firmware/runner/lean_libc.cpp reports an abort as an `error` record and `done` before it
 * stops; a library component has no result protocol, so both are no-ops here and the code
 * reaches the application through dk_abort_handler(DK_ERR_ABORT) (dk_board.h beside this). */
#ifndef DK_LIBRARY_SHIM_PROTOCOL_H
#define DK_LIBRARY_SHIM_PROTOCOL_H

#include <stdint.h>

#include "dk_errors.h"

#define DK_STATUS_ET_ERROR DK_ERR_ABORT

static inline void dk_send_error(uint32_t code, const char *message) {
  (void)code;
  (void)message;
}
static inline void dk_send_done(uint32_t status) { (void)status; }

#endif /* DK_LIBRARY_SHIM_PROTOCOL_H */
