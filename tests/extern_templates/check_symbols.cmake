# Checks with nm that <selfattn/extern_templates.hpp> really moves the kernels out of the calling translation unit
# (ctest test extern_templates_symbols, see CMakeLists.txt beside this file):
#   - caller.o defines no symbol of the kernels, the dispatch, the *_views entries or the projections;
#   - caller.o references (undefined) the float instances its calls go through;
#   - instances.o defines every float and double instance that extern_templates.hpp declares, under the same
#     names the first check looks for (so that check cannot pass because the names no longer match anything).
#   cmake -DNM=<nm> -DCALLER=<caller object> -DINSTANCES=<instances object> -P check_symbols.cmake
cmake_minimum_required(VERSION 3.20)
foreach(var IN ITEMS NM CALLER INSTANCES)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_symbols.cmake: -D${var}=... is required")
  endif()
endforeach()

# nm -C (demangled) with extra arguments; the whole output as one string, one symbol per line.
function(read_symbols object out)
  execute_process(COMMAND "${NM}" -C ${ARGN} "${object}" OUTPUT_VARIABLE text RESULT_VARIABLE result
                  ERROR_VARIABLE errors)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${NM} -C ${ARGN} ${object} failed (${result}): ${errors}")
  endif()
  set(${out} "\n${text}" PARENT_SCOPE)
endfunction()

read_symbols("${CALLER}" caller_defined --defined-only)
read_symbols("${CALLER}" caller_undefined -u)
read_symbols("${INSTANCES}" instances_defined --defined-only)

# Kernels and the templates in front of them: none may be defined in the caller.
set(kernel_names "selfattn::detail::(sdpa_forward_views|sdpa_forward_into_views|sdpa_backward_views|\
attention_weights_views|run_forward|\
fused_forward|fused_forward_block|fused_backward|fused_backward_tile|reference_forward|reference_backward|\
decode_forward|decode_general|decode_grouped|decode_streaming|linear_into|fused_qkv_projection)[a-z_]*<|\
selfattn::detail::micro::|selfattn::detail::isa_[a-z0-9]+::|selfattn::linear_backward<|\
selfattn::MultiHeadAttention<(float|double)>::(forward_walk|forward_into_walk|checked_step|step_walk|backward_walk|\
project)[a-z_]*(<[a-z, ]+>)?\\(")
string(REGEX MATCHALL "\n[^\n]*(${kernel_names})[^\n]*" offenders "${caller_defined}")
list(LENGTH offenders offender_count)
if(offender_count GREATER 0)
  string(REPLACE ";" "" shown "${offenders}")
  message(FATAL_ERROR "${CALLER} defines ${offender_count} kernel symbol(s) although it includes "
                      "<selfattn/extern_templates.hpp>:${shown}")
endif()

# The calls of caller.cpp go out to the instances.
# (sdpa_forward_into_views has a second parameter, the storage type of keys and values: float here too.)
foreach(name IN ITEMS "sdpa_forward_views<float>" "sdpa_forward_into_views<float, float>" "sdpa_backward_views<float>"
                      "attention_weights_views<float>")
  string(FIND "${caller_undefined}" "selfattn::detail::${name}(" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${CALLER} does not reference selfattn::detail::${name}: the calls did not go through the "
                        "extern instances")
  endif()
endforeach()

# Every declared instance is defined by instances.o, under the names matched above.
foreach(type IN ITEMS float double)
  foreach(name IN ITEMS "selfattn::detail::sdpa_forward_views<${type}>(" "selfattn::detail::sdpa_forward_into_views<${type}, ${type}>("
                        "selfattn::detail::sdpa_backward_views<${type}>(" "selfattn::detail::attention_weights_views<${type}>("
                        "selfattn::detail::run_forward<${type}>("
                        "selfattn::detail::linear_into<${type}>(" "selfattn::detail::fused_qkv_projection<${type}>("
                        "selfattn::detail::fused_qkv_projection_into<${type}, ${type}>("
                        "selfattn::linear_backward<${type}>(" "selfattn::MultiHeadAttention<${type}>::forward_walk("
                        "selfattn::MultiHeadAttention<${type}>::checked_step<${type}, ${type}, ${type}>("
                        "selfattn::MultiHeadAttention<${type}>::step_walk<${type}, ${type}>("
                        "selfattn::MultiHeadAttention<${type}>::forward_into_walk<${type}>("
                        "selfattn::TransformerLayer<${type}>::run_step<${type}, ${type}>("
                        "selfattn::MultiHeadAttention<${type}>::backward_walk(")
    string(FIND "${instances_defined}" "${name}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${INSTANCES} does not define ${name}...): <selfattn/instantiate.hpp> misses an instance")
    endif()
  endforeach()
endforeach()

string(REGEX MATCHALL "\n" lines "${caller_defined}")
list(LENGTH lines caller_count)
string(REGEX MATCHALL "\n[^\n]*(${kernel_names})[^\n]*" kernels "${instances_defined}")
list(LENGTH kernels kernel_count)
file(SIZE "${CALLER}" caller_size)
file(SIZE "${INSTANCES}" instances_size)
message(STATUS "caller: ${caller_size} bytes, ${caller_count} defined symbols, no kernel; "
               "instances: ${instances_size} bytes, ${kernel_count} kernel symbols")
