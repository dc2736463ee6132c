# cuDNN's fused flash attention (kernels/attention_cudnn.cpp), optional. It needs three things:
# cudnn.h, the library libcudnn (cuDNN 9), and the header-only cuDNN frontend (cudnn_frontend.h,
# the C++ graph API; `pip install nvidia-cudnn-frontend` ships it, see README).
#   FG_CUDNN=AUTO  use cuDNN when all three are found, else build without it (quietly);
#   FG_CUDNN=ON    the same, but a configure error naming what is missing;
#   FG_CUDNN=OFF   never.
# Where they are looked for: FG_CUDNN_FRONTEND_INCLUDE (a folder holding cudnn_frontend.h),
# CMAKE_PREFIX_PATH and the CUDA toolkit's folders, then python3's site-packages (the pip
# packages nvidia-cudnn-cu12 / -cu13 and nvidia-cudnn-frontend). Without cuDNN the build compiles
# kernels/attention_cudnn_stub.cpp instead, and causal_attention runs fusegrad's own kernels.
# Sets FG_WITH_CUDNN and, when ON, the interface target fg_cudnn (includes and libraries).
set(FG_CUDNN AUTO CACHE STRING "AUTO, ON or OFF: cuDNN's fused attention (needs cudnn.h, libcudnn, cudnn_frontend.h)")
set_property(CACHE FG_CUDNN PROPERTY STRINGS AUTO ON OFF)
set(FG_CUDNN_FRONTEND_INCLUDE "" CACHE PATH "Folder holding cudnn_frontend.h (the cuDNN frontend's include/)")

set(FG_WITH_CUDNN OFF)
string(TOUPPER "${FG_CUDNN}" _fg_cudnn)
if(_fg_cudnn STREQUAL "OFF")
    message(STATUS "fusegrad: cuDNN attention disabled (FG_CUDNN=OFF)")
    return()
endif()
if(NOT FG_WITH_CUDA)
    if(_fg_cudnn STREQUAL "ON")
        message(FATAL_ERROR "fusegrad: FG_CUDNN=ON needs the CUDA build, but CUDA is off or was not found")
    endif()
    return()
endif()

# python3's site-packages: pip's cuDNN puts nvidia/cudnn/{include,lib}, the frontend's wheel
# include/cudnn_frontend.h. Asked without importing the packages (which would load libraries).
find_program(FG_CUDNN_PYTHON NAMES python3 DOC "python3 whose site-packages may hold cuDNN and its frontend")
mark_as_advanced(FG_CUDNN_PYTHON)
set(_fg_py_cudnn "")
set(_fg_py_frontend "")
if(FG_CUDNN_PYTHON)
    execute_process(
        COMMAND ${FG_CUDNN_PYTHON} -c
"import importlib.util as u
try:
    s = u.find_spec('nvidia.cudnn')
    print(list(s.submodule_search_locations)[0])
except Exception:
    pass"
        OUTPUT_VARIABLE _fg_py_cudnn OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(
        COMMAND ${FG_CUDNN_PYTHON} -c
"import importlib.metadata as m, os
try:
    d = m.distribution('nvidia-cudnn-frontend')
    print(next(os.path.dirname(str(d.locate_file(f))) for f in (d.files or []) if str(f).replace(os.sep, '/').endswith('include/cudnn_frontend.h')))
except Exception:
    pass"
        OUTPUT_VARIABLE _fg_py_frontend OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()

find_path(FG_CUDNN_INCLUDE_DIR cudnn.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_fg_py_cudnn}/include
    DOC "Folder holding cudnn.h")
# The library beside the headers first; pip's wheels ship libcudnn.so.9 without libcudnn.so.
get_filename_component(_fg_cudnn_prefix "${FG_CUDNN_INCLUDE_DIR}" DIRECTORY)
find_library(FG_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
    HINTS ${_fg_cudnn_prefix}/lib ${_fg_cudnn_prefix}/lib64 ${CUDAToolkit_LIBRARY_DIR} ${_fg_py_cudnn}/lib
    DOC "libcudnn (cuDNN 9)")
mark_as_advanced(FG_CUDNN_INCLUDE_DIR FG_CUDNN_LIBRARY)
# The frontend: FG_CUDNN_FRONTEND_INCLUDE when given (or the environment variable of that name),
# else looked for (not cached, so that a later FG_CUDNN_FRONTEND_INCLUDE takes effect).
if(NOT FG_CUDNN_FRONTEND_INCLUDE AND DEFINED ENV{FG_CUDNN_FRONTEND_INCLUDE})
    set(FG_CUDNN_FRONTEND_INCLUDE "$ENV{FG_CUDNN_FRONTEND_INCLUDE}" CACHE PATH
        "Folder holding cudnn_frontend.h (the cuDNN frontend's include/)" FORCE)
endif()
if(FG_CUDNN_FRONTEND_INCLUDE)
    set(FG_CUDNN_FRONTEND_DIR "")
    if(EXISTS "${FG_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend.h")
        set(FG_CUDNN_FRONTEND_DIR "${FG_CUDNN_FRONTEND_INCLUDE}")
    endif()
else()
    find_path(FG_CUDNN_FRONTEND_DIR cudnn_frontend.h HINTS ${_fg_py_frontend} NO_CACHE)
endif()

set(_fg_missing "")
if(NOT FG_CUDNN_INCLUDE_DIR)
    list(APPEND _fg_missing "cudnn.h (cuDNN's headers: add their prefix to CMAKE_PREFIX_PATH or set FG_CUDNN_INCLUDE_DIR)")
endif()
if(NOT FG_CUDNN_LIBRARY)
    list(APPEND _fg_missing "libcudnn (cuDNN 9: add its prefix to CMAKE_PREFIX_PATH or set FG_CUDNN_LIBRARY)")
endif()
if(NOT FG_CUDNN_FRONTEND_DIR)
    if(FG_CUDNN_FRONTEND_INCLUDE)
        list(APPEND _fg_missing "cudnn_frontend.h in FG_CUDNN_FRONTEND_INCLUDE=${FG_CUDNN_FRONTEND_INCLUDE}")
    else()
        list(APPEND _fg_missing "cudnn_frontend.h (pip install nvidia-cudnn-frontend, or scripts/install_deps.sh --cudnn, or set FG_CUDNN_FRONTEND_INCLUDE)")
    endif()
endif()
if(_fg_missing)
    if(_fg_cudnn STREQUAL "ON")
        list(JOIN _fg_missing "\n  " _fg_list)
        message(FATAL_ERROR "fusegrad: FG_CUDNN=ON, but these were not found:\n  ${_fg_list}")
    endif()
    message(STATUS "fusegrad: cuDNN attention off (not all of cudnn.h, libcudnn, cudnn_frontend.h were found)")
    return()
endif()

file(STRINGS ${FG_CUDNN_INCLUDE_DIR}/cudnn_version.h _fg_cudnn_major REGEX "^#define CUDNN_MAJOR [0-9]+")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _fg_cudnn_major "${_fg_cudnn_major}")
if(NOT _fg_cudnn_major GREATER_EQUAL 9)
    if(_fg_cudnn STREQUAL "ON")
        message(FATAL_ERROR "fusegrad: FG_CUDNN=ON needs cuDNN 9, found major version '${_fg_cudnn_major}' in ${FG_CUDNN_INCLUDE_DIR}")
    endif()
    message(STATUS "fusegrad: cuDNN attention off (cuDNN ${_fg_cudnn_major} found, 9 needed)")
    return()
endif()

# The headers are included as system headers: the frontend's own warnings are not fusegrad's.
add_library(fg_cudnn INTERFACE)
target_include_directories(fg_cudnn SYSTEM INTERFACE ${FG_CUDNN_INCLUDE_DIR} ${FG_CUDNN_FRONTEND_DIR})
# NVRTC: recent frontends compile some of their own engines at run time (none that fusegrad uses,
# but the symbols are referenced).
target_link_libraries(fg_cudnn INTERFACE ${FG_CUDNN_LIBRARY} CUDA::cudart CUDA::nvrtc ${CMAKE_DL_LIBS})
# fusegrad never serialises graphs: leave out the frontend's JSON library (and its compile time).
target_compile_definitions(fg_cudnn INTERFACE CUDNN_FRONTEND_SKIP_JSON_LIB)
set(FG_WITH_CUDNN ON)
message(STATUS "fusegrad: cuDNN attention on: ${FG_CUDNN_LIBRARY}, headers ${FG_CUDNN_INCLUDE_DIR}, frontend ${FG_CUDNN_FRONTEND_DIR}")
