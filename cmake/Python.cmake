# FLEXH2O_PYTHON=AUTO builds the Python API (python/: `from flexh2o import LLM`) when pybind11
# (Debian: pybind11-dev) and Python's headers are found; ON requires them; OFF leaves it out.
# The module is a shared object linking the engine's static libraries, so they are compiled as
# position-independent code. Debian's python3 is preferred: its python3-pytest runs the tests
# (the module's ABI, cpython-3XY, suits any python3 of the same minor version).
set(FLEXH2O_PYTHON AUTO CACHE STRING "Build the Python API (python/): AUTO (when pybind11 is found), ON or OFF")
set_property(CACHE FLEXH2O_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(FLEXH2O_HAVE_PYTHON OFF)
if(NOT FLEXH2O_PYTHON STREQUAL "OFF")
  if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python COMPONENTS Interpreter Development.Module)
  if(Python_FOUND)
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python_FOUND AND pybind11_FOUND)
    set(FLEXH2O_HAVE_PYTHON ON)
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  elseif(FLEXH2O_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "FLEXH2O_PYTHON=ON but pybind11 or Python's headers were not found; install pybind11-dev and "
                        "python3-dev, or use -DFLEXH2O_PYTHON=OFF")
  endif()
endif()
message(STATUS "flexh2o: Python API ${FLEXH2O_HAVE_PYTHON} (${Python_EXECUTABLE})")
