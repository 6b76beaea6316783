/*
 * dk_deferred_ethos_u_backend.cpp: ExecuTorch's EthosUBackend (backends/arm/runtime/
 * EthosUBackend.cpp), registered by dk_lib_register_ethos_u_backend() from the first
 * dk_<model>_init() instead of by a static initializer, as the kernels are
 * (dk_deferred_registration.h says why: an application's own start-up code may run no C++
 * constructors, and nothing would pull the registering object out of an archive).
 *
 * The kernels' registration only needs its register_kernels() call renamed; EthosUBackend.cpp
 * also defines the backend object itself at namespace scope (`auto EthosUBackend_backend =
 * EthosUBackend();`), whose virtual destructor would still be registered with __cxa_atexit from
 * an .init_array entry. So firmware/library/ethos_u.cmake copies the source with exactly those
 * three statements (object, Backend record, register_backend() call) replaced by storage for the
 * object and a constant status (it stops with an error when ExecuTorch's source no longer has
 * them), and this file compiles that copy, DK_ETHOS_U_BACKEND_SOURCE, and constructs and
 * registers the backend when asked. Everything else of the source is compiled unchanged.
 */
#include DK_ETHOS_U_BACKEND_SOURCE

extern "C" int dk_lib_register_ethos_u_backend(void) {
  // The copy's unnamed namespace is this translation unit's: its names are visible here.
  using executorch::backends::arm::EthosUBackend;
  using executorch::backends::arm::EthosUBackend_registered;
  using executorch::backends::arm::EthosUBackend_storage;
  if (EthosUBackend_registered == Error::Ok) return 0;
  EthosUBackend *backend = new (EthosUBackend_storage) EthosUBackend();
  // register_backend() copies the record into the runtime's table.
  EthosUBackend_registered =
      executorch::runtime::register_backend(Backend{"EthosUBackend", backend});
  return static_cast<int>(EthosUBackend_registered);
}
