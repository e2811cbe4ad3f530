// The one translation unit of the test programs that compiles the kernels and the modules (float and double); every
// other test file includes <selfattn/extern_templates.hpp> (tests/CMakeLists.txt), as docs/using_in_projects.md
// recommends for programs of many files.
#include <selfattn/instantiate.hpp>
