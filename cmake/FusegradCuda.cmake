# CUDA detection. FG_CUDA=AUTO builds the kernels when a CUDA compiler works, ON insists on it
# (a clear configure error otherwise), OFF skips it. Sets FG_WITH_CUDA for the rest of the build.
include(CheckLanguage)

# The toolkit is often installed but not on PATH: offer its nvcc to check_language through CUDACXX
# (setting CMAKE_CUDA_COMPILER here would skip the check, and a broken nvcc would then fail the
# configure even in AUTO mode).
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(_fg_nvcc_on_path nvcc)
    if(NOT _fg_nvcc_on_path)
        set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
    endif()
endif()

set(FG_WITH_CUDA OFF)
string(TOUPPER "${FG_CUDA}" _fg_cuda)
if(_fg_cuda STREQUAL "OFF")
    message(STATUS "fusegrad: CUDA disabled (FG_CUDA=OFF); building the CPU path only")
else()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
        # 'native' fails on machines without a GPU (CI): default to an explicit list.
        if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
            set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures" FORCE)
        endif()
        enable_language(CUDA)
        set(CMAKE_CUDA_STANDARD 17)
        set(CMAKE_CUDA_STANDARD_REQUIRED ON)
        set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
        find_package(CUDAToolkit REQUIRED)
        set(FG_WITH_CUDA ON)
        message(STATUS "fusegrad: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
    elseif(_fg_cuda STREQUAL "ON")
        message(FATAL_ERROR "fusegrad: FG_CUDA=ON but no working CUDA compiler was found "
                            "(set CMAKE_CUDA_COMPILER or put nvcc on PATH)")
    else()
        message(STATUS "fusegrad: no CUDA compiler found; building the CPU path only")
    endif()
endif()
