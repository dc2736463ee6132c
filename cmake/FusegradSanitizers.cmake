# FG_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer on every C++ translation unit and
# link. Meant for CPU-only builds (CUDA's runtime and ASan do not mix well).
if(FG_SANITIZE)
    if(FG_WITH_CUDA)
        message(WARNING "fusegrad: FG_SANITIZE with CUDA on; prefer a CPU-only sanitizer build")
    endif()
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                        $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>
                        $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
    add_link_options(-fsanitize=address,undefined)
endif()
