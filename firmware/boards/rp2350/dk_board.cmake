# Board support for the RP2350 family (Raspberry Pi Pico 2), over the pico-sdk. Included (not
# added as a subdirectory) by firmware/pico/CMakeLists.txt after pico_sdk_init(), so that the
# per-source warning flags below apply in the directory that defines the firmware targets.
#
# dk_board is an INTERFACE library, like the SDK's own: its sources are compiled into each
# firmware executable with that executable's SDK configuration (stdio drivers, stack size).
set(_dk_rp2350_dir ${CMAKE_CURRENT_LIST_DIR})

add_library(dk_board INTERFACE)
target_sources(dk_board INTERFACE
  ${_dk_rp2350_dir}/board.c
  ${DK_FIRMWARE_DIR}/boards/dk_fault_capture.c
  ${_dk_rp2350_dir}/dk_link.c
  ${DK_FIRMWARE_DIR}/protocol/dk_protocol.c
)
target_include_directories(dk_board INTERFACE
  ${_dk_rp2350_dir}
  ${DK_FIRMWARE_DIR}/boards
  ${DK_FIRMWARE_DIR}/protocol
  ${DK_GENERATED_DIR}
)
target_link_libraries(dk_board INTERFACE pico_stdlib hardware_exception hardware_watchdog)
target_compile_definitions(dk_board INTERFACE
  DK_LINK_TRANSCRIPT_BYTES=${DK_LINK_TRANSCRIPT_BYTES}
  # The link's service tick (a timer interrupt) and the watchdog around execute() (0: none),
  # from the board file's serial.service_ms and watchdog.execute_ms.
  DK_LINK_SERVICE_MS=${DK_LINK_SERVICE_MS}
  DK_WATCHDOG_EXECUTE_MS=${DK_WATCHDOG_EXECUTE_MS}
  # The stack and heap are sized by the board file, through memory.ld and sections.ld; crt0's
  # spacer sections stay empty (they would only be counted twice).
  PICO_STACK_SIZE=0
  PICO_HEAP_SIZE=0
  # USB identity from the board file (the SDK's defaults are the same for RP2350).
  USBD_VID=${DK_USB_VID}
  USBD_PID=${DK_USB_PID_CDC}
  # No wait for a host at start-up (upstream's example waits 10 s): the serial link keeps the
  # results until the host asks for them (dk_link.h).
  PICO_STDIO_USB_CONNECT_WAIT_TIMEOUT_MS=0
  # Result frames are binary: never translate LF to CR LF (dk_link also writes raw).
  PICO_STDIO_DEFAULT_CRLF=0
  # The UART variant runs at the board file's rate.
  PICO_DEFAULT_UART_BAUD_RATE=${DK_PICO_UART_BAUD}
)
# deploykit's own sources, compiled with DK_WARNING_FLAGS. Source properties are scoped to a
# directory: dk_add_firmware() sets them in the directory that defines the executable.
set(DK_BOARD_OWN_SOURCES
  ${_dk_rp2350_dir}/board.c ${_dk_rp2350_dir}/dk_link.c ${DK_FIRMWARE_DIR}/protocol/dk_protocol.c
  ${DK_FIRMWARE_DIR}/boards/dk_fault_capture.c)

set(DK_BOARD_LINKER_SCRIPT ${_dk_rp2350_dir}/sections.ld)
