// The one translation unit of this project's programs and tests that compiles the
// kernels (CMakeLists.txt: tlm_kernels_once; kernels/levels.hpp: TLM_PRECOMPILED_KERNELS).
#include <tlm/precompiled_kernels.hpp>
