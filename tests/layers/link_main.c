/* link_main.c — the empty program of the layer_link_<layer> targets
 * (CMakeLists.txt): each links one library whole, with only the layers
 * below it, so a call from a layer into a layer above fails to link. */
int main(void) { return 0; }
