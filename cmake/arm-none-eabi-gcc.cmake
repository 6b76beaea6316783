# CMake toolchain file: Arm GNU toolchain (arm-none-eabi-gcc) + newlib-nano, bare metal.
#
#   cmake ... -DCMAKE_TOOLCHAIN_FILE=<repo>/cmake/arm-none-eabi-gcc.cmake \
#             -DDK_GENERATED_DIR=<dir holding the rendered board.cmake>
#
# The CPU flags come only from the generated board.cmake (DK_CPU_FLAGS, from the board file);
# no CPU flag or address is written here. Optional: -DDK_TOOLCHAIN_PREFIX=<path/prefix->
# (default arm-none-eabi-, found on PATH).

set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)

if(NOT DK_GENERATED_DIR)
  message(FATAL_ERROR
    "DK_GENERATED_DIR is not set. Pass -DDK_GENERATED_DIR=<dir with board.cmake, "
    "board_config.h and memory.ld> (rendered by deploykit).")
endif()
get_filename_component(DK_GENERATED_DIR "${DK_GENERATED_DIR}" ABSOLUTE)
if(NOT EXISTS "${DK_GENERATED_DIR}/board.cmake")
  message(FATAL_ERROR "${DK_GENERATED_DIR}/board.cmake does not exist; render the board files first.")
endif()
include("${DK_GENERATED_DIR}/board.cmake")
if(NOT DK_CPU_FLAGS)
  message(FATAL_ERROR "${DK_GENERATED_DIR}/board.cmake does not set DK_CPU_FLAGS.")
endif()

# try_compile() projects re-read this file: hand them the generated dir.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DK_GENERATED_DIR DK_TOOLCHAIN_PREFIX)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)

if(NOT DK_TOOLCHAIN_PREFIX)
  set(DK_TOOLCHAIN_PREFIX arm-none-eabi-)
endif()
set(CMAKE_C_COMPILER ${DK_TOOLCHAIN_PREFIX}gcc)
set(CMAKE_CXX_COMPILER ${DK_TOOLCHAIN_PREFIX}g++)
set(CMAKE_ASM_COMPILER ${DK_TOOLCHAIN_PREFIX}gcc)
set(CMAKE_OBJCOPY ${DK_TOOLCHAIN_PREFIX}objcopy CACHE FILEPATH "objcopy")
set(CMAKE_SIZE ${DK_TOOLCHAIN_PREFIX}size CACHE FILEPATH "size")

list(JOIN DK_CPU_FLAGS " " _dk_cpu_flags)
# newlib-nano (its headers too, so the specs go on the compile line) and per-function sections.
set(_dk_common "${_dk_cpu_flags} --specs=nano.specs -ffunction-sections -fdata-sections")
set(CMAKE_C_FLAGS_INIT "${_dk_common}")
set(CMAKE_CXX_FLAGS_INIT "${_dk_common}")
set(CMAKE_ASM_FLAGS_INIT "${_dk_cpu_flags}")
# CMAKE_<LANG>_FLAGS are on the link line too, so nano.specs is not repeated here (a second
# --specs=nano.specs is a fatal error).
set(CMAKE_EXE_LINKER_FLAGS_INIT "--specs=nosys.specs -Wl,--gc-sections")

# Position-dependent code by default (about 4% smaller; no GOT to copy).
set(CMAKE_POSITION_INDEPENDENT_CODE OFF CACHE BOOL "Build position-independent code")

set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
