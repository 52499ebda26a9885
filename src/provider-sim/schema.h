/* SPDX-License-Identifier: Apache-2.0 */
/*
 * schema.h - provider-sim's migrations (component "provider-sim"), applied at start-up.
 */
#ifndef SIM_SCHEMA_H
#define SIM_SCHEMA_H

#include "idem/idem.h"

/* Applies provider-sim's migrations; *applied (may be NULL) receives how many ran. */
int schema_migrate(struct idem_store *st, int *applied, char **errmsg);

#endif /* SIM_SCHEMA_H */
