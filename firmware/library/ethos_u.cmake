# ethos_u.cmake: the Ethos-U NPU half of a library component (DK_ETHOS_U=ON, which deploykit
# passes for ethos_u_int8 models on a board with an npu section: readers/npu.py,
# npu_firmware_definitions; docs/library.md, "The Ethos-U boards"). Included by CMakeLists.txt
# after dk_executorch_link(), which has built the runtime cache's Ethos-U half
# (cmake/executorch-runtime/ethos_u.cmake) and imported it as dk_et::ethosu_core_driver and
# dk_et::executorch_delegate_ethos_u.
#
# Into the component's archive (${_dk_lib}):
#   - ExecuTorch's EthosUBackend, backends/arm/runtime: EthosUBackend.cpp (through
#     dk_deferred_ethos_u_backend.cpp, registration at init), EthosUBackend_Cortex_M.cpp,
#     VelaBinStream.cpp, EthosUBackend_IoMemcpy.cpp, with the runtime's options and the driver's
#     definitions, as the runtime cache compiles them. The cache's libexecutorch_delegate_ethos_u.a
#     is not shipped: its EthosUBackend.cpp object registers the backend from a static
#     initializer (.init_array).
#   - dk_ethos_u.cpp: dk_npu_init(), dk_npu_irq_handler(), the driver's cache and semaphore hooks,
#     the fast arena.
# Shipped from the cache unchanged: libethosu_core_driver.a (Arm's core driver).
# Into the component's libc archive: the delegates' handle pool (DK_LEAN_LIBC_HANDLE_POOL).
if(NOT TARGET dk_et::ethosu_core_driver)
  message(FATAL_ERROR "DK_ETHOS_U=ON but the runtime has no Ethos-U half (dk_executorch_link).")
endif()

set(_dk_arm_rt ${EXECUTORCH_SOURCE_DIR}/backends/arm/runtime)
set(_dk_backend_src ${_dk_arm_rt}/EthosUBackend.cpp)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_dk_backend_src})

# EthosUBackend.cpp with its three registering statements (ExecuTorch v1.4.1) replaced by the
# backend's storage and a constant status; dk_deferred_ethos_u_backend.cpp constructs and
# registers it. Written only when it changes, so a reconfigure recompiles nothing.
set(_dk_static_registration [=[
auto EthosUBackend_backend = EthosUBackend();
Backend EthosUBackend_id{"EthosUBackend", &EthosUBackend_backend};
static executorch::runtime::Error EthosUBackend_registered =
    register_backend(EthosUBackend_id);
]=])
set(_dk_deferred_registration [=[
// deploykit library (firmware/library/ethos_u.cmake): the backend is constructed in this
// storage and registered by dk_lib_register_ethos_u_backend() (dk_deferred_ethos_u_backend.cpp)
// from the component's first dk_<model>_init(), not by a static initializer.
alignas(EthosUBackend) unsigned char EthosUBackend_storage[sizeof(EthosUBackend)];
executorch::runtime::Error EthosUBackend_registered = executorch::runtime::Error::NotFound;
]=])
file(READ ${_dk_backend_src} _dk_text)
string(FIND "${_dk_text}" "${_dk_static_registration}" _dk_at)
if(_dk_at EQUAL -1)
  message(FATAL_ERROR
    "${_dk_backend_src} does not register EthosUBackend as ExecuTorch v1.4.1 does (the three "
    "statements from 'auto EthosUBackend_backend = EthosUBackend();' to "
    "'register_backend(EthosUBackend_id);'), so deploykit cannot defer its registration to "
    "the component's init: update firmware/library/ethos_u.cmake for this ExecuTorch.")
endif()
string(REPLACE "${_dk_static_registration}" "${_dk_deferred_registration}" _dk_text "${_dk_text}")
set(_dk_backend_copy ${CMAKE_CURRENT_BINARY_DIR}/dk_ethos_u/EthosUBackend.cpp)
file(WRITE ${_dk_backend_copy}.new "${_dk_text}")
configure_file(${_dk_backend_copy}.new ${_dk_backend_copy} COPYONLY)

add_library(dk_lib_ethos_u_backend OBJECT
  ${CMAKE_CURRENT_SOURCE_DIR}/dk_deferred_ethos_u_backend.cpp
  ${_dk_arm_rt}/EthosUBackend_Cortex_M.cpp
  ${_dk_arm_rt}/VelaBinStream.cpp
  ${_dk_arm_rt}/EthosUBackend_IoMemcpy.cpp)
set_target_properties(dk_lib_ethos_u_backend PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                                                        CXX_EXTENSIONS OFF)
target_compile_definitions(dk_lib_ethos_u_backend PRIVATE
  "DK_ETHOS_U_BACKEND_SOURCE=\"${_dk_backend_copy}\"")
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/dk_deferred_ethos_u_backend.cpp
  PROPERTIES OBJECT_DEPENDS ${_dk_backend_copy})
# The runtime's usage requirements (include directories, definitions, options) and the
# driver's headers and definitions (ETHOSU55/ETHOSU85, ETHOSU_ARCH, ...).
target_link_libraries(dk_lib_ethos_u_backend PRIVATE dk_et::ethosu_core_driver
                                                     dk_et::executorch_core)
add_dependencies(dk_lib_ethos_u_backend dk_et_runtime)

target_sources(${_dk_lib} PRIVATE
  $<TARGET_OBJECTS:dk_lib_ethos_u_backend>
  ${CMAKE_CURRENT_SOURCE_DIR}/dk_ethos_u.cpp)
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/dk_ethos_u.cpp PROPERTIES
  COMPILE_OPTIONS "${DK_WARNING_FLAGS}")
target_link_libraries(${_dk_lib} PRIVATE dk_et::ethosu_core_driver)
