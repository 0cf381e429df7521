// One JavaScript context of `execspace serve`'s code interpreter: a Node process in the sandbox's session that
// keeps its globals between cells. A cell comes in on stdin as one JSON line {"id", "code", "env"}; E2B's output
// lines go out on stdout, each after a record separator (RS) so that what a child process writes to the same
// descriptor stays apart from them. Every line names its cell: the server drops the lines of a cell it gave up on.
// Its own names live in this function's scope, not in the global one that the cells declare theirs in.
// Started with the argument `typescript`, it is a TypeScript context: each cell's types are removed by Node's own
// module.stripTypeScriptTypes (Node 22.13+; 'transform' mode also turns enums and namespaces into JavaScript).
(() => {
  'use strict';
  const fs = require('fs');
  const { createRequire } = require('module');
  const path = require('path');
  const readline = require('readline');
  const util = require('util');
  const vm = require('vm');

  // Node's REPL rewrites top-level `await` (keeping the last expression's value and the declarations) with this;
  // it is internal (hence --expose-internals). Without it a cell with `await` fails to compile, as in a script.
  let rewriteAwait = null;
  try {
    rewriteAwait = require('internal/repl/await').processTopLevelAwait;
  } catch {}

  // Node's own parser (the REPL's): finds a cell's ESM imports (see esm below)
  let acorn = null;
  let walk = null;
  try {
    acorn = require('internal/deps/acorn/acorn/dist/acorn');
    walk = require('internal/deps/acorn/acorn-walk/dist/walk');
  } catch {}

  const typescript = process.argv[1] === 'typescript';
  const { stripTypeScriptTypes } = require('module');

  const RS = '\x1e';
  let cell = null; // the running cell's id
  let count = 0;
  let interrupt = null; // rejects the running cell's pending await

  // Node makes a socket or pipe stdout non-blocking: a full one fails a write with EAGAIN, so wait a little and go on
  const pause = new Int32Array(new SharedArrayBuffer(4));

  function emit(line) {
    const bytes = Buffer.from(RS + JSON.stringify({ ...line, cell }) + '\n', 'utf8');
    for (let at = 0; at < bytes.length; ) {
      try {
        at += fs.writeSync(1, bytes, at);
      } catch (error) {
        if (error.code !== 'EAGAIN') throw error;
        Atomics.wait(pause, 0, 0, 1);
      }
    }
  }

  // a frame stays well under the server's line cap (MAX_LINE in jscontext.py), however long the write
  const PIECE = 16384;

  function capture(stream) {
    return (chunk, encoding, callback) => {
      const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
      if (cell !== null) {
        const timestamp = new Date().toISOString();
        for (let at = 0; at < text.length; at += PIECE) {
          emit({ type: stream, text: text.slice(at, at + PIECE), timestamp });
        }
      }
      const done = typeof encoding === 'function' ? encoding : callback;
      if (done) done();
      return true;
    };
  }
  process.stdout.write = capture('stdout');
  process.stderr.write = capture('stderr');

  // cells load packages as a script in the working directory would
  globalThis.require = createRequire(path.join(process.cwd(), '[cell]'));

  function userStack(error) {
    // the frames of this file and of Node's internals below the cell say nothing to the cell's author
    const lines = String(error.stack || error).split('\n');
    const first = lines.findIndex((l) => /^\s+at /.test(l));
    if (first < 0) return lines.join('\n');
    const own = lines.slice(first).filter((l) => l.includes('cell['));
    return [...lines.slice(0, first), ...own].join('\n');
  }

  function failure(error) {
    if (error instanceof Error) {
      return { type: 'error', name: error.name, value: error.message, traceback: userStack(error) };
    }
    return { type: 'error', name: 'Error', value: util.inspect(error), traceback: 'Uncaught ' + util.inspect(error) };
  }

  // a late callback's failure is reported, never the end of the context
  process.on('uncaughtException', (error) => cell !== null && emit(failure(error)));
  process.on('unhandledRejection', (error) => cell !== null && emit(failure(error)));
  process.on('SIGINT', () => interrupt && interrupt(new Error('Interrupted: the cell was stopped')));

  function awaited(promise) {
    return new Promise((resolve, reject) => {
      interrupt = reject;
      promise.then(resolve, reject);
    }).finally(() => {
      interrupt = null;
    });
  }

  // A cell is a script, where neither `import … from` parses nor `import()` has a loader. As E2B's kernel turns a
  // cell's imports into requires, each top-level import declaration becomes a `var` bound from the module's
  // namespace (a later cell sees its names, a cell run again declares them again), and every import() is one made
  // by this file, which resolves as a module in the context's directory would (its node_modules, then upwards).
  const ESM = `globalThis[Symbol.for('execspace.esm')]`;
  Object.defineProperty(globalThis, Symbol.for('execspace.esm'), {
    value: Object.freeze({
      load: (specifier, options) => import(specifier, options),
      // a name a CommonJS module's namespace lacks (its exports Node could not see statically) is read from its
      // module.exports, as require would give it
      names: (namespace) =>
        new Proxy(namespace, {
          get: (target, name) => (name in target || target.default == null ? target[name] : target.default[name]),
        }),
    }),
  });

  function parse(code) {
    const options = { ecmaVersion: 'latest', allowAwaitOutsideFunction: true, allowHashBang: true };
    for (const sourceType of ['script', 'module']) {
      try {
        return acorn.parse(code, { ...options, sourceType });
      } catch {}
    }
    return null; // the script's own compile says what is wrong
  }

  function binding(code, declaration) {
    const text = (node) => code.slice(node.start, node.end);
    const attributes = (declaration.attributes || []).map(text);
    const options = attributes.length ? `, { with: { ${attributes.join(', ')} } }` : '';
    const load = `await ${ESM}.load(${text(declaration.source)}${options})`;
    let namespace = null;
    const names = [];
    for (const spec of declaration.specifiers) {
      if (spec.type === 'ImportNamespaceSpecifier') namespace = spec.local.name;
      else if (spec.type === 'ImportDefaultSpecifier') names.push(`default: ${spec.local.name}`);
      else names.push(`${text(spec.imported)}: ${spec.local.name}`);
    }
    const named = `{ ${names.join(', ')} }`;
    const from = (namespace) => `${ESM}.names(${namespace})`;
    if (namespace === null) return names.length ? `var ${named} = ${from(load)};` : `${load};`;
    return `var ${namespace} = ${load}` + (names.length ? `, ${named} = ${from(namespace)};` : ';');
  }

  function esm(code) {
    if (acorn === null || !code.includes('import')) return code;
    const program = parse(code);
    if (program === null) return code;
    const edits = [];
    for (const node of program.body) {
      if (node.type !== 'ImportDeclaration') continue;
      const lines = code.slice(node.start, node.end).split('\n').length - 1;
      edits.push([node.start, node.end, binding(code, node) + '\n'.repeat(lines)]); // errors keep their lines
    }
    walk.full(program, (node) => {
      if (node.type === 'ImportExpression') edits.push([node.start, node.start + 'import'.length, `${ESM}.load`]);
    });
    edits.sort((a, b) => b[0] - a[0]);
    for (const [start, end, text] of edits) code = code.slice(0, start) + text + code.slice(end);
    return code;
  }

  async function evaluate(source) {
    const code = esm(typescript ? stripTypeScriptTypes(source, { mode: 'transform' }) : source);
    const rewritten = rewriteAwait ? rewriteAwait(code) : null;
    const script = new vm.Script(rewritten ?? code, { filename: `cell[${count}]` });
    const value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (rewritten === null) return value;
    const wrapped = await awaited(value);
    return wrapped === undefined ? undefined : wrapped.value;
  }

  async function run(request) {
    cell = String(request.id);
    count += 1;
    emit({ type: 'number_of_executions', execution_count: count });
    const env = request.env || {};
    const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
    Object.assign(process.env, env);
    try {
      const value = await evaluate(String(request.code));
      if (value !== undefined) {
        emit({ type: 'result', data: { 'text/plain': util.inspect(value) } });
      }
    } catch (error) {
      emit(failure(error));
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      emit({ type: 'done' });
      cell = null;
    }
  }

  let queue = Promise.resolve();
  readline.createInterface({ input: process.stdin }).on('line', (line) => {
    let request;
    try {
      request = JSON.parse(line);
    } catch {
      return;
    }
    queue = queue.then(() => run(request));
  });
})();
