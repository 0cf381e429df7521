// The JavaScript code-interpreter SDK's smoke run against `execspace serve` (tests/server/test_code_interpreter.py
// copies it next to an `npm install @e2b/code-interpreter` and runs it with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY set). Prints "ok" when every check passed.
import { Sandbox } from '@e2b/code-interpreter'

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`)
}

const sbx = await Sandbox.create()
try {
  const out = []
  await sbx.runCode('x = 41\nprint("from js")', { onStdout: (m) => out.push(m.line) })
  check(out.join('') === 'from js\n', `stdout callback, got ${JSON.stringify(out)}`)
  const execution = await sbx.runCode('x + 1')
  check(execution.text === '42', `state kept, got ${execution.text}`)
  const failed = await sbx.runCode('1 / 0')
  check(failed.error && failed.error.name === 'ZeroDivisionError', `error, got ${JSON.stringify(failed.error)}`)
  const ctx = await sbx.createCodeContext()
  const other = await sbx.runCode('x', { context: ctx })
  check(other.error && other.error.name === 'NameError', 'contexts do not share variables')
  await sbx.runCode('const y = 20', { language: 'js' })
  const node = await sbx.runCode('y + 1', { language: 'js' })
  check(node.text === '21', `a JavaScript context keeps its state, got ${node.text}`)
  const ts = await sbx.runCode('const z: number = await Promise.resolve(2)\nz * 21', { language: 'ts' })
  check(ts.text === '42', `a TypeScript context, got ${JSON.stringify(ts)}`)
  await sbx.runCode('cd /tmp', { language: 'bash' })
  const sh = await sbx.runCode('echo "$PWD"; (exit 3)', { language: 'bash' })
  check(sh.logs.stdout.join('') === '/tmp\n', `a bash context keeps its directory, got ${sh.logs.stdout}`)
  check(sh.error && sh.error.name === 'ExitCode' && sh.error.value === '3', `bash status, got ${sh.error}`)
  console.log('ok')
} finally {
  await sbx.kill()
}
