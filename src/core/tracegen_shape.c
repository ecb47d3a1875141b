/* tracegen_shape.c — model shape presets for the trace generator (see
 * eldr/tracegen.h): names to (layers, experts, top-k) and MoE layer ids. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "eldr/tracegen.h"
#include "tracegen_int.h"

/* ------------------------------------------------------------------------ */
/* Model shapes (public Hugging Face configs, see docs/trace.md)            */

typedef struct shape_preset {
  const char *key, *canonical;
  uint32_t L, E, K;
  uint32_t first_layer, layer_step; /* MoE layer ids: first + i * step */
} shape_preset;

static const shape_preset k_shapes[] = {
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", 48, 128, 8, 0, 1},
    {"gpt-oss-120b", "gpt-oss-120b", 36, 128, 4, 0, 1},
    {"qwen3-235b-a22b", "Qwen3-235B-A22B", 94, 128, 8, 0, 1},
    {"llama4-maverick", "Llama-4-Maverick-17B-128E-Instruct", 24, 128, 1, 1, 2},
    {"olmoe-1b-7b", "OLMoE-1B-7B-0924", 16, 64, 8, 0, 1},
    /* deepseek-ai/DeepSeek-V3: 61 layers, the first 3 dense, 256 routed experts top-8 */
    {"deepseek-v3", "DeepSeek-V3", 58, 256, 8, 3, 1},
};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

static int parse_u32_strict(const char **p, uint32_t *out) {
  const char *s = *p;
  if (!isdigit((unsigned char)*s)) return -1;
  uint64_t v = 0;
  while (isdigit((unsigned char)*s)) {
    v = v * 10 + (uint64_t)(*s - '0');
    if (v > 0xffffffffu) return -1;
    s++;
  }
  *out = (uint32_t)v;
  *p = s;
  return 0;
}

int eldr_tracegen_model_shape(const char *name, eldr_shape *shape, char *canonical,
                              size_t canonical_cap, eldr_diag *d) {
  if (!name || !shape) return eldr_diag_fail(d, ELDR_EINVAL, "model name missing");
  for (size_t i = 0; i < N_SHAPES; i++) {
    if (strcmp(name, k_shapes[i].key) && strcmp(name, k_shapes[i].canonical)) continue;
    shape->num_layers = k_shapes[i].L;
    shape->num_experts = k_shapes[i].E;
    shape->top_k = k_shapes[i].K;
    tracegen_copy_str(canonical, canonical_cap, k_shapes[i].canonical);
    return ELDR_OK;
  }
  if (!strncmp(name, "custom:", 7)) {
    const char *p = name + 7;
    uint32_t v[3];
    for (int i = 0; i < 3; i++) {
      if (parse_u32_strict(&p, &v[i]))
        return eldr_diag_fail(d, ELDR_EINVAL, "model '%s': expected custom:L,E,K (integers)", name);
      if (i < 2 && *p++ != ',')
        return eldr_diag_fail(d, ELDR_EINVAL, "model '%s': expected custom:L,E,K", name);
    }
    if (*p) return eldr_diag_fail(d, ELDR_EINVAL, "model '%s': expected custom:L,E,K", name);
    eldr_shape s = {v[0], v[1], v[2]};
    int rc = eldr_shape_validate(&s, d);
    if (rc) {
      eldr_diag_prefix(d, "model '%s'", name);
      return rc;
    }
    *shape = s;
    if (canonical && canonical_cap)
      snprintf(canonical, canonical_cap, "custom-%u-%u-%u", v[0], v[1], v[2]);
    return ELDR_OK;
  }
  return eldr_diag_fail(d, ELDR_EINVAL,
                        "unknown model '%s' (qwen3-30b-a3b, gpt-oss-120b, qwen3-235b-a22b, "
                        "llama4-maverick, olmoe-1b-7b, deepseek-v3, custom:L,E,K)",
                        name);
}

void eldr_tracegen_layer_ids(const char *model_name, const eldr_shape *shape, uint32_t *ids) {
  uint32_t first = 0, step = 1;
  for (size_t i = 0; model_name && i < N_SHAPES; i++) {
    if ((!strcmp(model_name, k_shapes[i].key) || !strcmp(model_name, k_shapes[i].canonical)) &&
        shape->num_layers == k_shapes[i].L) {
      first = k_shapes[i].first_layer;
      step = k_shapes[i].layer_step;
    }
  }
  for (uint32_t l = 0; l < shape->num_layers; l++) ids[l] = first + l * step;
}

int eldr_tracegen_served_layers(const char *served, eldr_shape *shape, uint32_t *ids, uint32_t *hidden) {
  if (!served) return ELDR_ENOTFOUND;
  const char *base = strrchr(served, '/');
  base = base ? base + 1 : served;
  for (size_t i = 0; i < N_SHAPES; i++) {
    const shape_preset *p = &k_shapes[i];
    if (strcasecmp(base, p->key) && strncasecmp(base, p->canonical, strlen(p->canonical))) continue;
    *shape = (eldr_shape){p->L, p->E, p->K};
    for (uint32_t l = 0; l < p->L; l++) ids[l] = p->first_layer + l * p->layer_step;
    *hidden = ids[p->L - 1] + 1;
    return ELDR_OK;
  }
  return ELDR_ENOTFOUND;
}
