/* eldr/placement_io.h — EP placements as SGLang `--init-expert-location`
 * JSON files.
 *
 * SGLang (python/sglang/srt/eplb/expert_location.py) loads the file with
 * json.loads and, when it has "physical_to_logical_map", calls
 * ExpertLocationMetadata.init_by_mapping(server_args, model_config,
 * **data): the object must hold exactly that one key (another key is an
 * unexpected keyword argument), a (num_hidden_layers x num_physical_experts)
 * array of logical expert ids; physical expert p sits on EP rank
 * p / (num_physical_experts / ep_size); num_physical_experts = routed experts
 * + --ep-num-redundant-experts. Rows are indexed by the model's layer id
 * (DeepSeek-V3's 3 dense layers have rows too, unused).
 *
 *   {"physical_to_logical_map": [[e, e, ...], ...]}
 *
 * The writer emits one row per model layer 0..rows-1: MoE layer l of the
 * placement goes to row layer_ids[l]; the other rows hold the trivial map
 * (p mod E). The reader takes the rows named by layer_ids back. Errors name
 * the file and the row/column: ELDR_EPARSE (JSON, missing or extra key,
 * non-integer entry), ELDR_ESHAPE (ragged rows, a layer id past the last
 * row, physical count not a multiple of the EP size), ELDR_ERANGE (an id
 * out of [0, E), an expert with no slot), ELDR_EIO, ELDR_ENOMEM.
 *
 * Ownership: dump returns a malloc'd string; parse/load return a new indexed
 * placement (eldr_placement_free).
 */
#ifndef ELDR_PLACEMENT_IO_H
#define ELDR_PLACEMENT_IO_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/placement.h"

/* rows = model layers (>= every layer_ids[l] + 1). NULL on a bad argument or
 * allocation failure. layer_ids NULL = 0..L-1. */
char *eldr_placement_dump(const eldr_placement *p, const uint32_t *layer_ids, uint32_t rows);
/* Write atomically (temp file next to path, then rename). */
int eldr_placement_save(const char *path, const eldr_placement *p, const uint32_t *layer_ids,
                        uint32_t rows, eldr_diag *d);

/* Parse: experts = logical experts E, ep_size = R, layer_ids (L entries, or
 * NULL = 0..L-1) select the rows. */
int eldr_placement_parse(const char *json, size_t len, uint32_t experts, uint32_t ep_size,
                         const uint32_t *layer_ids, uint32_t layers, eldr_placement **out,
                         eldr_diag *d);
int eldr_placement_load(const char *path, uint32_t experts, uint32_t ep_size,
                        const uint32_t *layer_ids, uint32_t layers, eldr_placement **out,
                        eldr_diag *d);

#endif
