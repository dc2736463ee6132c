# NCCL, for data-parallel training on several GPUs (kernels/nccl.h), optional.
#   FG_NCCL=AUTO  use NCCL when nccl.h and libnccl are found, else build without it (quietly);
#   FG_NCCL=ON    the same, but a configure error naming what is missing;
#   FG_NCCL=OFF   never.
# Looked for in CMAKE_PREFIX_PATH and the CUDA toolkit's folders, then python3's site-packages
# (pip's nvidia-nccl-cu12 / -cu13: nvidia/nccl/{include,lib}, libnccl.so.2 without an unversioned
# link). Without NCCL the build compiles kernels/nccl_stub.cpp, which says so, and the trainer
# refuses several CUDA ranks naming FG_NCCL. Sets FG_WITH_NCCL and, when ON, the target fg_nccl.
set(FG_NCCL AUTO CACHE STRING "AUTO, ON or OFF: NCCL for training on several GPUs")
set_property(CACHE FG_NCCL PROPERTY STRINGS AUTO ON OFF)

set(FG_WITH_NCCL OFF)
string(TOUPPER "${FG_NCCL}" _fg_nccl)
if(_fg_nccl STREQUAL "OFF")
    message(STATUS "fusegrad: NCCL disabled (FG_NCCL=OFF)")
    return()
endif()
if(NOT FG_WITH_CUDA)
    if(_fg_nccl STREQUAL "ON")
        message(FATAL_ERROR "fusegrad: FG_NCCL=ON needs the CUDA build, but CUDA is off or was not found")
    endif()
    return()
endif()

find_program(FG_NCCL_PYTHON NAMES python3 DOC "python3 whose site-packages may hold NCCL")
mark_as_advanced(FG_NCCL_PYTHON)
set(_fg_py_nccl "")
if(FG_NCCL_PYTHON)
    execute_process(
        COMMAND ${FG_NCCL_PYTHON} -c
"import importlib.util as u
try:
    print(list(u.find_spec('nvidia.nccl').submodule_search_locations)[0])
except Exception:
    pass"
        OUTPUT_VARIABLE _fg_py_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(FG_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_fg_py_nccl}/include
    DOC "Folder holding nccl.h")
get_filename_component(_fg_nccl_prefix "${FG_NCCL_INCLUDE_DIR}" DIRECTORY)
find_library(FG_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
    HINTS ${_fg_nccl_prefix}/lib ${_fg_nccl_prefix}/lib64 ${CUDAToolkit_LIBRARY_DIR} ${_fg_py_nccl}/lib
    DOC "libnccl")
mark_as_advanced(FG_NCCL_INCLUDE_DIR FG_NCCL_LIBRARY)
if(NOT FG_NCCL_INCLUDE_DIR OR NOT FG_NCCL_LIBRARY)
    if(_fg_nccl STREQUAL "ON")
        message(FATAL_ERROR "fusegrad: FG_NCCL=ON, but nccl.h (${FG_NCCL_INCLUDE_DIR}) or libnccl "
                            "(${FG_NCCL_LIBRARY}) was not found: add NCCL's prefix to CMAKE_PREFIX_PATH")
    endif()
    message(STATUS "fusegrad: NCCL off (nccl.h or libnccl not found)")
    return()
endif()
add_library(fg_nccl INTERFACE)
target_include_directories(fg_nccl SYSTEM INTERFACE ${FG_NCCL_INCLUDE_DIR})
target_link_libraries(fg_nccl INTERFACE ${FG_NCCL_LIBRARY})
set(FG_WITH_NCCL ON)
message(STATUS "fusegrad: NCCL on: ${FG_NCCL_LIBRARY}, headers ${FG_NCCL_INCLUDE_DIR}")
