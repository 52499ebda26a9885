#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
// stripe_client.js - drives an API with the official Stripe Node.js SDK (npm package `stripe`),
// its own retries included, for tests/service/test_gateway_clients.py.
//
//   NODE_PATH="$(npm root -g)" node stripe_client.js CONFIG [INTENTS]
//
// CONFIG is JSON (inline, or @FILE) with the client's settings, as an application would pass
// them to the SDK:
//   {"host": "127.0.0.1", "port": 8180, "apiKey": "sk_test_...", "maxNetworkRetries": 5,
//    "timeout": 80000, "keepAlive": true, "concurrency": 0, "apiVersion": null, "noAuth": false,
//    "protocol": "http"}
// (protocol "https" speaks TLS, trusting what node trusts: NODE_EXTRA_CA_CERTS adds a CA;
// keepAlive false gives every attempt a connection of its own;
// concurrency 0 runs every intent at once; noAuth sends no Authorization header at all, through
// the SDK's own `authenticator` hook).
//
// INTENTS is a JSON array (a file, or stdin without one), each a call to make:
//   {"intent": "i-1", "op": "charges.create" | "customers.create",
//    "params": {"amount": 500, "currency": "usd", "metadata": {...}},
//    "idempotencyKey": "...",     // optional: else the SDK makes its own (stripe-node-retry-...)
//    "stripeAccount": "acct_...", "apiKey": "sk_test_...", "maxNetworkRetries": N,
//    "timeout": MS}              // optional per-request options
// metadata.intent is set to the intent's name when params do not set it: it is how this script
// (and the upstream's ledger) tell which request belongs to which intent.
//
// It prints one JSON line per intent, as each ends:
//   {"intent", "ok": true, "id", "object", "requestId", "stripeVersion", "idempotencyKey",
//    "replayed", "attempts", "tries", "ms"}
//   {"intent", "ok": false, "error": err.constructor.name, "type": err.type,
//    "rawType": err.rawType, "code", "statusCode", "shouldRetry": headers['stripe-should-retry'],
//    "requestId", "message", "attempts", "tries", "ms"}
// where attempts counts the HTTP requests the SDK sent for the intent (retries included) and
// tries says what came of each: its status, or the error code of a lost answer (ECONNRESET,
// ETIMEDOUT...).  The exit code is 0 once every intent has its line, 2 on bad input.
'use strict';

const fs = require('fs');
const http = require('http');
const https = require('https');

let Stripe;
try {
  Stripe = require('stripe');
} catch (e) {
  process.stderr.write('stripe_client: cannot load the stripe package (run scripts/deps.sh test; ' +
                       'NODE_PATH=$(npm root -g)): ' + e.message + '\n');
  process.exit(3);
}

function readJson(arg, what) {
  try {
    if (arg === undefined) return JSON.parse(fs.readFileSync(0, 'utf8'));
    if (arg.startsWith('@')) return JSON.parse(fs.readFileSync(arg.slice(1), 'utf8'));
    if (arg.trim().startsWith('{') || arg.trim().startsWith('[')) return JSON.parse(arg);
    return JSON.parse(fs.readFileSync(arg, 'utf8'));
  } catch (e) {
    process.stderr.write('stripe_client: bad ' + what + ': ' + e.message + '\n');
    process.exit(2);
  }
}

const cfg = readJson(process.argv[2], 'config');
const intents = readJson(process.argv[3], 'intents');
if (!Array.isArray(intents)) {
  process.stderr.write('stripe_client: intents must be a JSON array\n');
  process.exit(2);
}

const options = {
  host: cfg.host || '127.0.0.1',
  port: cfg.port,
  protocol: cfg.protocol === 'https' ? 'https' : 'http',
  maxNetworkRetries: cfg.maxNetworkRetries === undefined ? 5 : cfg.maxNetworkRetries,
  timeout: cfg.timeout === undefined ? 80000 : cfg.timeout,
  telemetry: false,
};
const agent = new (options.protocol === 'https' ? https : http).Agent({
  keepAlive: cfg.keepAlive !== false,
});
options.httpAgent = agent;
if (cfg.apiVersion) options.apiVersion = cfg.apiVersion;
if (cfg.noAuth) options.authenticator = async () => {}; // sends no Authorization header
// Every attempt the SDK makes, per intent: its HTTP client wrapped (the SDK's documented
// `httpClient` option), so each retry shows with what came of it -- a status, or the error that
// made the SDK retry (ECONNRESET, ETIMEDOUT...).
const tries = new Map();
function intentOfBody(body) {
  if (typeof body !== 'string') return undefined;
  try {
    const v = new URLSearchParams(body).get('metadata[intent]');
    if (v !== null) return v;
  } catch (e) { /* not a form */ }
  return undefined;
}
const baseClient = Stripe.createNodeHttpClient(options.httpAgent);
const httpClient = Object.create(baseClient);
httpClient.makeRequest = function (host, port, path, method, headers, body, protocol, timeout) {
  const name = intentOfBody(body);
  const rec = {};
  if (name !== undefined) {
    if (!tries.has(name)) tries.set(name, []);
    tries.get(name).push(rec);
  }
  return baseClient.makeRequest(host, port, path, method, headers, body, protocol, timeout).then(
      (res) => {
        rec.status = res.getStatusCode();
        const h = res.getHeaders() || {};
        if (h['stripe-should-retry'] !== undefined) rec.shouldRetry = h['stripe-should-retry'];
        return res;
      },
      (err) => {
        rec.error = (err && err.code) || String(err);
        throw err;
      });
};
options.httpClient = httpClient;
delete options.httpAgent;
const stripe = cfg.noAuth ? new Stripe(null, options) : new Stripe(cfg.apiKey, options);

function emit(doc) {
  process.stdout.write(JSON.stringify(doc) + '\n');
}

async function runOne(it) {
  const name = String(it.intent);
  const params = JSON.parse(JSON.stringify(it.params || {}));
  params.metadata = Object.assign({}, params.metadata || {});
  if (params.metadata.intent === undefined) params.metadata.intent = name;
  const reqOpts = {};
  if (it.idempotencyKey) reqOpts.idempotencyKey = it.idempotencyKey;
  if (it.stripeAccount) reqOpts.stripeAccount = it.stripeAccount;
  if (it.apiKey) reqOpts.apiKey = it.apiKey;
  if (it.maxNetworkRetries !== undefined) reqOpts.maxNetworkRetries = it.maxNetworkRetries;
  if (it.timeout !== undefined) reqOpts.timeout = it.timeout;
  const [resource, method] = (it.op || 'charges.create').split('.');
  const t0 = Date.now();
  const common = () => {
    const t = tries.get(name) || [];
    return {
      intent: name,
      attempts: t.length,
      tries: t.map((r) => (r.status !== undefined ? r.status : r.error || 'pending')),
      ms: Date.now() - t0,
    };
  };
  try {
    const obj = await stripe[resource][method](params, reqOpts);
    const last = obj.lastResponse || {};
    const headers = last.headers || {};
    emit(Object.assign({
      ok: true,
      id: obj.id,
      object: obj.object,
      amount: obj.amount,
      requestId: last.requestId || headers['request-id'] || null,
      stripeVersion: headers['stripe-version'] || null,
      replayed: headers['idempotent-replayed'] || null,
      idempotencyKey: it.idempotencyKey || null,
    }, common()));
  } catch (err) {
    const headers = err.headers || {};
    emit(Object.assign({
      ok: false,
      error: err.constructor ? err.constructor.name : String(err),
      type: err.type === undefined ? null : err.type,
      rawType: err.rawType === undefined ? null : err.rawType,
      code: err.code === undefined ? null : err.code,
      statusCode: err.statusCode === undefined ? null : err.statusCode,
      shouldRetry: headers['stripe-should-retry'] === undefined ? null
                                                                 : headers['stripe-should-retry'],
      requestId: err.requestId || null,
      message: String(err.message || '').slice(0, 500),
    }, common()));
  }
}

async function main() {
  const limit = cfg.concurrency > 0 ? cfg.concurrency : intents.length;
  let next = 0;
  async function worker() {
    while (next < intents.length) {
      const it = intents[next++];
      await runOne(it);
    }
  }
  const workers = [];
  for (let i = 0; i < Math.min(limit, intents.length); i++) workers.push(worker());
  await Promise.all(workers);
  agent.destroy();
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write('stripe_client: ' + (e && e.stack ? e.stack : e) + '\n');
  process.exit(1);
});
