// A shared object without the entry symbol: the loader must say so.

extern "C" __attribute__((visibility("default"))) int not_a_pinstage_plugin(void) { return 42; }
