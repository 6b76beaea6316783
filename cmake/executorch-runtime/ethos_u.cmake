# ethos_u.cmake: the Ethos-U NPU half of the cached runtime (included by CMakeLists.txt when
# DK_ETHOS_U is ON; docs/runtime-build.md, "The Ethos-U delegate").
#
#   ethosu_core_driver           Arm's Ethos-U core driver, built by the driver's own CMake
#                                project from DK_ETHOS_U_DRIVER_DIR (Arm's repository or the
#                                Zephyr module zephyrproject-rtos/hal_ethos_u: the same tree),
#                                for ETHOSU_TARGET_NPU_CONFIG=DK_ETHOS_U_NPU_CONFIG
#                                (ethos-u55-128, ethos-u85-256, ...), with CMSIS_6's
#                                CMSIS/Core/Include from DK_CMSIS_DIR.
#   executorch_delegate_ethos_u  ExecuTorch's backends/arm/runtime: EthosUBackend.cpp (the
#                                backend and its static registration), EthosUBackend_Cortex_M.cpp
#                                (the bare-metal driver calls), VelaBinStream.cpp and
#                                EthosUBackend_IoMemcpy.cpp (the weak arm_ethos_io_memcpy),
#                                compiled against the driver's headers, as ExecuTorch's own
#                                backends/arm/CMakeLists.txt lists them for
#                                EXECUTORCH_BUILD_ARM_BAREMETAL (whose fetch from Arm's GitLab
#                                is not used).
#
# Inputs: DK_ETHOS_U_DRIVER_DIR, DK_CMSIS_DIR, DK_ETHOS_U_NPU_CONFIG (all required), DK_ET_LOGGING
# (the driver's own log lines, fprintf to stderr, follow the runtime's logging).
foreach(_v DK_ETHOS_U_DRIVER_DIR DK_CMSIS_DIR DK_ETHOS_U_NPU_CONFIG)
  if(NOT ${_v})
    message(FATAL_ERROR "DK_ETHOS_U=ON needs ${_v} (deploykit passes it: readers/npu.py, "
                        "npu_firmware_definitions).")
  endif()
endforeach()
foreach(_f include/ethosu_driver.h include/pmu_ethosu.h src/ethosu_driver.c CMakeLists.txt)
  if(NOT EXISTS "${DK_ETHOS_U_DRIVER_DIR}/${_f}")
    message(FATAL_ERROR "DK_ETHOS_U_DRIVER_DIR=${DK_ETHOS_U_DRIVER_DIR} is not the Ethos-U core "
                        "driver (no ${_f}): give Arm's ethos-u-core-driver or the Zephyr module "
                        "hal_ethos_u (deploykit setup --source ethos-u-core-driver=PATH@REV).")
  endif()
endforeach()
if(NOT EXISTS "${DK_CMSIS_DIR}/CMSIS/Core/Include/cmsis_compiler.h")
  message(FATAL_ERROR "DK_CMSIS_DIR=${DK_CMSIS_DIR} is not CMSIS_6 (no "
                      "CMSIS/Core/Include/cmsis_compiler.h).")
endif()
if(NOT DK_ETHOS_U_NPU_CONFIG MATCHES "^ethos-u(55|65|85)-[0-9]+$")
  message(FATAL_ERROR "DK_ETHOS_U_NPU_CONFIG=${DK_ETHOS_U_NPU_CONFIG}: expected e.g. ethos-u85-256")
endif()

# The driver's own project, unchanged. Its cache variables, set before it is added.
set(CMSIS_PATH "${DK_CMSIS_DIR}" CACHE PATH "CMSIS_6 for the Ethos-U driver" FORCE)
set(ETHOSU_TARGET_NPU_CONFIG "${DK_ETHOS_U_NPU_CONFIG}" CACHE STRING "" FORCE)
set(ETHOSU_LOG_ENABLE ${DK_ET_LOGGING} CACHE BOOL "" FORCE)
set(ETHOSU_LOG_SEVERITY "warning" CACHE STRING "" FORCE)
# A command stream that has not finished after this long fails the run (the firmware's
# ethosu_semaphore_take counts it in milliseconds: firmware/runner/npu_ethos_u.cpp).
set(DK_NPU_INFERENCE_TIMEOUT_MS 60000)
set(ETHOSU_INFERENCE_TIMEOUT ${DK_NPU_INFERENCE_TIMEOUT_MS} CACHE STRING "" FORCE)
add_subdirectory(${DK_ETHOS_U_DRIVER_DIR} ethosu_core_driver EXCLUDE_FROM_ALL)
# -Wno-psabi etc. come from the global options; the driver adds its own -Werror.

set(_arm_rt ${EXECUTORCH_ROOT}/backends/arm/runtime)
add_library(executorch_delegate_ethos_u STATIC EXCLUDE_FROM_ALL
  ${_arm_rt}/EthosUBackend.cpp
  ${_arm_rt}/EthosUBackend_Cortex_M.cpp
  ${_arm_rt}/VelaBinStream.cpp
  ${_arm_rt}/EthosUBackend_IoMemcpy.cpp)
target_link_libraries(executorch_delegate_ethos_u PRIVATE executorch_core)
target_include_directories(executorch_delegate_ethos_u PRIVATE
  ${_common_include_directories} ${DK_ETHOS_U_DRIVER_DIR}/include)
# The driver's public definitions (ETHOSU, ETHOSU55/ETHOSU85, ETHOSU_ARCH, ETHOSU_MACS).
target_compile_definitions(executorch_delegate_ethos_u PRIVATE
  $<TARGET_PROPERTY:ethosu_core_driver,INTERFACE_COMPILE_DEFINITIONS>)
target_compile_options(executorch_delegate_ethos_u PRIVATE ${_common_compile_options})

set(_ethos_u_libs ethosu_core_driver executorch_delegate_ethos_u)
string(APPEND _dk_ethos_u_lines
  "set(DK_RT_ETHOS_U ON)\n"
  "set(DK_RT_ETHOS_U_NPU_CONFIG \"${DK_ETHOS_U_NPU_CONFIG}\")\n"
  "set(DK_RT_ETHOS_U_INCLUDE_DIRS \"${DK_ETHOS_U_DRIVER_DIR}/include\")\n"
  "set(DK_RT_ETHOS_U_DEFINITIONS "
  "\"$<TARGET_PROPERTY:ethosu_core_driver,INTERFACE_COMPILE_DEFINITIONS>;"
  "DK_NPU_INFERENCE_TIMEOUT_MS=${DK_NPU_INFERENCE_TIMEOUT_MS}\")\n")
