#!/usr/bin/env node
// ONNX Runtime, model only: how many tiles per second the CPU execution
// provider gets through one ONNX ResNet when nothing else is done (no raster
// reading, no normalization, no output). This is the peer's upper bound, not
// an end-to-end figure.
//
//   node ort_model.js MODEL.onnx --batch 64 --tile 64 --bands 6 [--threads 2]
//                     [--warmup 3] [--runs 20]
//
// Prints one JSON line: {"tiles_per_s", "seconds", "runs", "batch", ...}.
// Input tensors are random (fixed seed), made once before timing.
'use strict';

const ort = require('onnxruntime-node');

function parseArgs(argv) {
  const opts = { batch: 64, tile: 64, bands: 6, threads: 2, warmup: 3, runs: 20 };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith('--')) {
      const key = a.slice(2);
      if (!(key in opts) || i + 1 >= argv.length) {
        throw new Error(`unknown option or missing value: ${a}`);
      }
      const v = Number(argv[++i]);
      if (!Number.isInteger(v) || v < 0) throw new Error(`${a}: expected a whole number`);
      opts[key] = v;
    } else {
      rest.push(a);
    }
  }
  if (rest.length !== 1) throw new Error('usage: ort_model.js MODEL.onnx [--batch N] ...');
  opts.model = rest[0];
  return opts;
}

// Small deterministic generator: the values only need to look like
// normalized pixels, and every run should feed the same ones.
function fillRandom(arr, seed) {
  let s = seed >>> 0;
  for (let i = 0; i < arr.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    arr[i] = (s / 4294967296) * 4 - 2;
  }
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const session = await ort.InferenceSession.create(o.model, {
    executionProviders: ['cpu'],
    intraOpNumThreads: o.threads,
    interOpNumThreads: 1,
    graphOptimizationLevel: 'all',
    executionMode: 'sequential',
  });
  const data = new Float32Array(o.batch * o.bands * o.tile * o.tile);
  fillRandom(data, 12345);
  const feeds = {};
  feeds[session.inputNames[0]] = new ort.Tensor('float32', data, [o.batch, o.bands, o.tile, o.tile]);

  for (let i = 0; i < o.warmup; i++) await session.run(feeds);
  const t0 = process.hrtime.bigint();
  let out = null;
  for (let i = 0; i < o.runs; i++) out = await session.run(feeds);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const logits = out[session.outputNames[0]];
  if (logits.dims[0] !== o.batch) throw new Error(`output batch ${logits.dims[0]} != ${o.batch}`);

  console.log(JSON.stringify({
    tiles_per_s: (o.batch * o.runs) / seconds,
    seconds,
    runs: o.runs,
    batch: o.batch,
    tile: o.tile,
    threads: o.threads,
    onnxruntime: ort.env.versions.node || ort.env.versions.common,
  }));
}

main().catch((e) => {
  console.error(`ort_model.js: ${e.message}`);
  process.exit(1);
});
