# Warning flags for our own programs (tests, examples, benchmarks). Never used on the
# selfattn INTERFACE target: users choose their own flags. Eigen comes in through an
# imported target, hence as a SYSTEM include, so -Werror judges our code only
# (g++ 12 emits false -Warray-bounds / -Wmaybe-uninitialized inside Eigen 3.4).
function(selfattn_target_warnings target)
  if(MSVC)
    target_compile_options(${target} PRIVATE /W4)
    if(SELFATTN_WERROR)
      target_compile_options(${target} PRIVATE /WX)
    endif()
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
    if(SELFATTN_WERROR)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
  endif()
endfunction()
