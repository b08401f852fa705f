# FLEXH2O_CUDA=AUTO turns the CUDA backend on when a CUDA compiler is found.
# CMAKE_CUDA_ARCHITECTURES defaults to 90 (H100/H200, as CI compiles); pass e.g.
# -DCMAKE_CUDA_ARCHITECTURES="80;90" for more GPUs (a GPU without code in the build is
# reported by make_backend and falls back to the CPU under "auto").
set(FLEXH2O_HAVE_CUDA OFF)
if(FLEXH2O_SANITIZE AND NOT FLEXH2O_CUDA STREQUAL "OFF")
  # The sanitizer flags go to every compiler, nvcc included, which does not take them.
  if(FLEXH2O_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLEXH2O_SANITIZE=ON cannot be combined with FLEXH2O_CUDA=ON; use -DFLEXH2O_CUDA=OFF")
  endif()
  message(STATUS "flexh2o: FLEXH2O_SANITIZE=ON, so the CUDA backend is left out")
elseif(NOT FLEXH2O_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows nvcc's dialect flags only up to C++17; nvcc >= 12 takes -std=c++20.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(FLEXH2O_HAVE_CUDA ON)
  elseif(FLEXH2O_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLEXH2O_CUDA=ON but no CUDA compiler was found; install the CUDA toolkit or use -DFLEXH2O_CUDA=OFF")
  endif()
endif()
message(STATUS "flexh2o: CUDA backend ${FLEXH2O_HAVE_CUDA}")
