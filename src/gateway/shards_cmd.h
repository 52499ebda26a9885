/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shards_cmd.h - `idem-gateway shards init|show|move`: a shard set's directory set up, shown,
 * and a bucket moved, on libidem's calls (docs/shards.md).
 */
#ifndef IDEM_GATEWAY_SHARDS_CMD_H
#define IDEM_GATEWAY_SHARDS_CMD_H

/* Runs `shards ...` (argv[0] "shards"); returns the exit status. */
int cmd_shards(int argc, char **argv);

#endif
