// SPDX-License-Identifier: Apache-2.0
// express_override.js - the documented Express upstream that honours method overrides, for
// tests/service/test_gateway_failopen.py: Express 4 with its body parsers (which inflate gzip and
// deflate bodies) and method-override 3.0.0 three times, as its README shows -- the
// X-HTTP-Method-Override header, a `_method` query argument, and a `_method` body field (form or
// JSON) -- so the last one that names a method wins.
//
// PUT /v1/orders/:id counts a run per id and answers 201 {ran: "PUT", id, runs}; any other
// method on it answers 200 {ran: METHOD}.  GET /runs/:id is how many times PUT ran for that id.
// Prints "port N" once listening on 127.0.0.1 (an ephemeral port).  Run with NODE_PATH set to
// `npm root -g` (scripts/deps.sh installs both packages there).
'use strict';

const express = require('express');
const methodOverride = require('method-override');

const app = express();
const runs = new Map();

app.use(express.urlencoded({ extended: true }));
app.use(express.json());
app.use(methodOverride('X-HTTP-Method-Override'));
app.use(methodOverride('_method'));
app.use(methodOverride((req) => {
  if (req.body && typeof req.body === 'object' && '_method' in req.body) {
    const method = req.body._method;
    delete req.body._method;
    return method;
  }
  return undefined;
}));

app.put('/v1/orders/:id', (req, res) => {
  const n = (runs.get(req.params.id) || 0) + 1;
  runs.set(req.params.id, n);
  res.status(201).json({ ran: 'PUT', id: req.params.id, runs: n });
});
app.all('/v1/orders/:id', (req, res) => res.json({ ran: req.method }));
app.get('/runs/:id', (req, res) => res.json({ runs: runs.get(req.params.id) || 0 }));

const server = app.listen(0, '127.0.0.1', () => {
  process.stdout.write('port ' + server.address().port + '\n');
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
