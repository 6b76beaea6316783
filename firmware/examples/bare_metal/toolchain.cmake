# A plain arm-none-eabi-gcc toolchain file, as an application brings its own: the CPU flags
# come from APP_CPU_FLAGS (e.g. "-mcpu=cortex-m55 -mfloat-abi=hard"), newlib-nano, no
# deploykit files.
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-none-eabi-gcc)
set(CMAKE_CXX_COMPILER arm-none-eabi-g++)
set(CMAKE_ASM_COMPILER arm-none-eabi-gcc)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES APP_CPU_FLAGS)
if(NOT APP_CPU_FLAGS)
  message(FATAL_ERROR "Pass -DAPP_CPU_FLAGS=\"-mcpu=... -mfloat-abi=...\".")
endif()
set(CMAKE_C_FLAGS_INIT "${APP_CPU_FLAGS} -mthumb --specs=nano.specs -ffunction-sections -fdata-sections")
set(CMAKE_CXX_FLAGS_INIT "${CMAKE_C_FLAGS_INIT}")
set(CMAKE_ASM_FLAGS_INIT "${APP_CPU_FLAGS} -mthumb")
set(CMAKE_EXE_LINKER_FLAGS_INIT "--specs=nosys.specs -nostartfiles -Wl,--gc-sections")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
