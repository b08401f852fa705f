// The program of each <library>_link_check (engine/CMakeLists.txt): it links one library whole
// against only what its link line names, and runs nothing.
int main() { return 0; }
