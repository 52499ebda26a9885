#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
// server.js - the Node peers of `make bench-peers` (bench/peers_bench.py, docs/bench.md "Node
// peers"): one node:http server that does what orderd's create does in spirit, with or without
// the @node-idempotency middleware.
//
//   node server.js [--listen 127.0.0.1:0] [--redis redis://127.0.0.1:PORT] [--workers N]
//
// POST /api/orders   needs "Authorization: Bearer ..." (401) and Content-Type application/json
//                    (415); reads the JSON body ({"productId": string, "quantity": integer
//                    1..1000}, else 400 / 422), makes an order id and answers 201 with orderd's
//                    JSON shape.
//                    Nothing is stored: there is no database behind it.
// GET /stats         what this process answered so far, as JSON (the bench checks its runs by it).
//
// With --redis the route runs behind @node-idempotency/core on the Redis storage adapter
// (@node-idempotency/storage-adapter-redis), wired as the project's own Express middleware
// (packages/plugin-express/src/middleware.ts of node-idempotency, @node-idempotency/express,
// which is not on the npm registry; core's README: "you can utilise the core package directly"):
//   - onRequest before the handler: a new key is claimed with SET NX PX (IN_PROGRESS, the
//     blake2s256 fingerprint of JSON.stringify(body)); a completed key answers its stored
//     response with "Idempotent-Replayed: true"; an outstanding key is 409 with Retry-After: 1,
//     a different body under the same key 422, a key over 256 characters 400 (shared/src/http.ts);
//   - the handler's answer is sent at once and onResponse stores it (SET PX, COMPLETE, the status,
//     the Content-Type and the body parsed back from JSON) without being awaited, as the
//     middleware's `void handleResponse(...)` does. So an answer can leave before its record is
//     written, and Redis runs with no persistence: nothing here is durable.
// Without --redis it is the same route with no idempotency at all (and the gateway's upstream).
//
// One process by default: Node runs its JavaScript on one thread, so the server uses at most one
// core.  --workers N (node:cluster) forks N such processes sharing the port (each with its own
// Redis connection); GET /stats then answers the sum over the workers.
//
// stdout carries one line, "listening on http://HOST:PORT" (bench/bench.py reads it); everything
// else goes to stderr.  SIGTERM / SIGINT close the server and the Redis connection.
"use strict";

const http = require("node:http");
const crypto = require("node:crypto");
const cluster = require("node:cluster");

// The Redis adapter logs client errors with console.log; keep stdout for the one line above.
console.log = console.error;

function parseArgs(argv) {
  const out = { listen: "127.0.0.1:0", redis: null, workers: "1" };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if ((a === "--listen" || a === "--redis" || a === "--workers") && i + 1 < argv.length) {
      out[a.slice(2)] = argv[++i];
    } else {
      process.stderr.write("usage: node server.js [--listen HOST:PORT] " +
                           "[--redis redis://HOST:PORT] [--workers N]\n");
      process.exit(2);
    }
  }
  out.workers = Number(out.workers);
  if (!Number.isInteger(out.workers) || out.workers < 1 || out.workers > 64) {
    process.stderr.write("--workers wants 1..64\n");
    process.exit(2);
  }
  const m = /^(.*):(\d+)$/.exec(out.listen);
  if (!m) {
    process.stderr.write("--listen wants HOST:PORT\n");
    process.exit(2);
  }
  out.host = m[1];
  out.port = Number(m[2]);
  return out;
}

// What this process answered: the bench compares these with wrk's counts.
const stats = {
  mode: "plain", executed: 0, replayed: 0, in_progress: 0, mismatch: 0, rejected: 0,
  errors: 0, completion_errors: 0,
};

// shared/src/http.ts's idempotency2HttpCodeMap (@node-idempotency/shared).
function idemStatus(code) {
  return { IDEMPOTENCY_FINGERPRINT_MISSMATCH: 422, IDEMPOTENCY_KEY_LEN_EXEEDED: 400,
           IDEMPOTENCY_KEY_MISSING: 400, REQUEST_IN_PROGRESS: 409 }[code] || 500;
}

function send(res, status, obj, extra) {
  const body = JSON.stringify(obj);
  const headers = { "Content-Type": "application/json",
                    "Content-Length": Buffer.byteLength(body) };
  if (extra) Object.assign(headers, extra);
  res.writeHead(status, headers);
  res.end(body);
}

function problem(res, status, code, detail, extra) {
  send(res, status, { type: code, title: detail, status }, extra);
}

// The business logic: orderd's create in spirit (validate, make an id, answer 201), no store.
function createOrder(body) {
  if (body === null || typeof body !== "object" || typeof body.productId !== "string" ||
      !Number.isInteger(body.quantity) || body.quantity < 1 || body.quantity > 1000) {
    return { status: 422, body: { type: "invalid-order", title: "productId and quantity 1..1000",
                                  status: 422 } };
  }
  const unitPrice = 1999;
  return {
    status: 201,
    body: {
      orderId: "ord_" + crypto.randomBytes(16).toString("hex"),
      status: "created",
      productId: body.productId,
      quantity: body.quantity,
      unitPrice,
      amount: unitPrice * body.quantity,
      currency: "EUR",
      createdAt: new Date().toISOString(),
    },
  };
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => {
      size += c.length;
      if (size > 65536) {
        reject(new Error("body too large"));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

// --workers N: the primary forks the workers, prints the one "listening on" line once all of them
// listen, sums their counters for GET /stats, and stops them on SIGTERM / SIGINT.
function primary(args) {
  const pending = new Map(); // stats request id -> {from, want, sum}
  let listening = 0;
  let nextId = 1;
  for (let i = 0; i < args.workers; i++) cluster.fork();
  cluster.on("listening", (w, addr) => {
    if (++listening === args.workers) {
      process.stdout.write(`server.js (${args.redis ? "node-idempotency+redis" : "plain"}, ` +
                           `${args.workers} workers): listening on ` +
                           `http://${addr.address}:${addr.port}\n`);
    }
  });
  cluster.on("message", (w, msg) => {
    if (msg && msg.type === "stats-ask") {
      const id = nextId++;
      const workers = Object.values(cluster.workers);
      pending.set(id, { from: w, ask: msg.ask, want: workers.length, sum: null });
      for (const x of workers) x.send({ type: "stats-get", id });
    } else if (msg && msg.type === "stats-got") {
      const p = pending.get(msg.id);
      if (!p) return;
      if (p.sum === null) p.sum = { ...msg.stats, workers: 0 };
      else for (const k of Object.keys(msg.stats)) {
        if (typeof msg.stats[k] === "number") p.sum[k] += msg.stats[k];
      }
      p.sum.workers++;
      if (--p.want === 0) {
        pending.delete(msg.id);
        p.from.send({ type: "stats-sum", ask: p.ask, stats: p.sum });
      }
    }
  });
  cluster.on("exit", (w, code, signal) => {
    if (!stopping) {
      process.stderr.write(`worker ${w.process.pid} exited (${code || signal})\n`);
      process.exit(1);
    }
  });
  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    for (const w of Object.values(cluster.workers)) w.process.kill("SIGTERM");
    const t = setInterval(() => {
      if (Object.keys(cluster.workers).length === 0) process.exit(0);
    }, 50);
    setTimeout(() => process.exit(0), 5000).unref();
    t.unref();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.workers > 1 && cluster.isPrimary) {
    primary(args);
    return;
  }
  // In a worker: GET /stats asks the primary for the sum over all workers.
  const asks = new Map();
  let nextAsk = 1;
  if (cluster.isWorker) {
    process.on("message", (msg) => {
      if (msg && msg.type === "stats-get") {
        process.send({ type: "stats-got", id: msg.id, stats });
      } else if (msg && msg.type === "stats-sum") {
        const resolve = asks.get(msg.ask);
        asks.delete(msg.ask);
        if (resolve) resolve(msg.stats);
      }
    });
  }
  function allStats() {
    if (!cluster.isWorker) return Promise.resolve(stats);
    return new Promise((resolve) => {
      const ask = nextAsk++;
      asks.set(ask, resolve);
      process.send({ type: "stats-ask", ask });
    });
  }
  let idem = null;
  let storage = null;
  let IdempotencyError = null;
  if (args.redis) {
    const core = require("@node-idempotency/core");
    const { RedisStorageAdapter } = require("@node-idempotency/storage-adapter-redis");
    storage = new RedisStorageAdapter({ url: args.redis });
    await storage.connect();
    idem = new core.Idempotency(storage, {});
    IdempotencyError = core.IdempotencyError;
    stats.mode = "node-idempotency+redis";
  }

  // The route behind the middleware (as plugin-express's successHandler, on node:http).
  async function idempotent(req, res, body) {
    const ireq = { headers: req.headers, body, path: req.url, method: req.method };
    let cached;
    try {
      cached = await idem.onRequest(ireq);
    } catch (err) {
      if (err instanceof IdempotencyError) {
        const status = idemStatus(err.code);
        if (err.code === "REQUEST_IN_PROGRESS") stats.in_progress++;
        else if (err.code === "IDEMPOTENCY_FINGERPRINT_MISSMATCH") stats.mismatch++;
        else stats.rejected++;
        problem(res, status, err.code, err.message,
                err.code === "REQUEST_IN_PROGRESS" ? { "Retry-After": "1" } : null);
        return;
      }
      throw err;
    }
    if (cached) {
      stats.replayed++;
      const a = cached.additional || {};
      const headers = { "Idempotent-Replayed": "true" };
      if (a["Content-Type"]) headers["Content-Type"] = a["Content-Type"];
      const payload = cached.body !== undefined ? cached.body : cached.error;
      const text = typeof payload === "string" ? payload : JSON.stringify(payload);
      headers["Content-Length"] = Buffer.byteLength(text);
      res.writeHead(a.statusCode || 200, headers);
      res.end(text);
      return;
    }
    const out = createOrder(body);
    stats.executed++;
    const text = JSON.stringify(out.body);
    // The middleware's handleResponse: the response's JSON parsed back and stored, not awaited.
    idem.onResponse(ireq, {
      additional: { statusCode: out.status, "Content-Type": "application/json" },
      ...(out.status < 400 ? { body: JSON.parse(text) } : { error: JSON.parse(text) }),
    }).catch((err) => {
      stats.completion_errors++;
      process.stderr.write("onResponse: " + err + "\n");
    });
    res.writeHead(out.status, { "Content-Type": "application/json",
                                "Content-Length": Buffer.byteLength(text) });
    res.end(text);
  }

  async function handle(req, res) {
    if (req.method === "GET" && req.url === "/stats") {
      send(res, 200, await allStats());
      return;
    }
    if (req.url !== "/api/orders" && !req.url.startsWith("/api/orders?")) {
      problem(res, 404, "not-found", "no such route");
      return;
    }
    if (req.method !== "POST") {
      problem(res, 405, "method-not-allowed", "POST only", { Allow: "POST" });
      return;
    }
    if (!/^Bearer \S+/.test(req.headers.authorization || "")) {
      stats.rejected++;
      problem(res, 401, "unauthorized", "a bearer token is required");
      return;
    }
    if (!/^application\/json\b/i.test(req.headers["content-type"] || "")) {
      stats.rejected++;
      problem(res, 415, "unsupported-media-type", "application/json only");
      return;
    }
    let body;
    try {
      body = JSON.parse((await readBody(req)).toString("utf8"));
    } catch (err) {
      stats.rejected++;
      problem(res, 400, "bad-request", "the body is not JSON");
      return;
    }
    if (idem) {
      await idempotent(req, res, body);
      return;
    }
    const out = createOrder(body);
    stats.executed++;
    send(res, out.status, out.body);
  }

  const server = http.createServer((req, res) => {
    handle(req, res).catch((err) => {
      stats.errors++;
      process.stderr.write("request: " + (err && err.stack || err) + "\n");
      if (!res.headersSent) problem(res, 500, "internal", "internal error");
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 65000;
  server.headersTimeout = 66000;
  server.on("error", (err) => {
    process.stderr.write("server: " + err + "\n");
    process.exit(1);
  });
  server.listen(args.port, args.host, () => {
    if (cluster.isWorker) return; // the primary says where, once every worker listens
    const a = server.address();
    process.stdout.write(`server.js (${stats.mode}): listening on http://${a.address}:${a.port}\n`);
  });

  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    server.close();
    server.closeAllConnections();
    const done = storage ? storage.disconnect() : Promise.resolve();
    done.finally(() => process.exit(0));
    setTimeout(() => process.exit(0), 3000).unref();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((err) => {
  process.stderr.write("server.js: " + (err && err.stack || err) + "\n");
  process.exit(1);
});
