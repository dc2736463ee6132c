# Warnings for fusegrad's own targets: -Wall -Wextra for C++ (and for nvcc's host compiler),
# promoted to errors when FG_WERROR is on (CI).
function(fg_set_warnings target)
    set(cxx_flags -Wall -Wextra)
    if(FG_WERROR)
        list(APPEND cxx_flags -Werror)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${cxx_flags}>)
    if(FG_WITH_CUDA)
        string(REPLACE ";" "," host_flags "${cxx_flags}")
        target_compile_options(${target} PRIVATE
            $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${host_flags}>)
        if(FG_WERROR)
            target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
        endif()
    endif()
endfunction()
