// The JavaScript SDK's smoke run against `execspace serve` (tests/server/test_js_sdk.py copies it next to an
// `npm install e2b` and runs it with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set). One line per failure;
// prints "ok" when every check passed.
import { CommandExitError, Sandbox, SandboxError } from 'e2b'

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`)
}

const sbx = await Sandbox.create({ metadata: { sdk: 'js' }, envs: { X: 'from-js' } })
try {
  check((await sbx.getInfo()).metadata.sdk === 'js', 'metadata')
  check((await sbx.commands.run('echo $X')).stdout === 'from-js\n', 'env and stdout')
  let code = null
  try {
    await sbx.commands.run('echo err >&2; exit 3')
  } catch (err) {
    check(err instanceof CommandExitError, `CommandExitError, got ${err}`)
    code = err.exitCode
    check(err.stderr === 'err\n', 'stderr of the failed command')
  }
  check(code === 3, `exit code 3, got ${code}`)
  const bg = await sbx.commands.run('read line; echo "got:$line"', { background: true, stdin: true })
  await sbx.commands.sendStdin(bg.pid, 'hi\n')
  check((await bg.wait()).stdout === 'got:hi\n', 'background command with stdin')
  const every = new Uint8Array(256).map((_, i) => i)
  await sbx.files.write('js/all.bin', every.buffer)
  const back = await sbx.files.read('js/all.bin', { format: 'bytes' })
  check(back.length === 256 && back.every((b, i) => b === i), 'every byte value round trip')
  await sbx.files.write('js/t.txt', 'text')
  check((await sbx.files.read('js/t.txt')) === 'text', 'text round trip')
  const names = (await sbx.files.list('js')).map((e) => e.name).sort()
  check(JSON.stringify(names) === '["all.bin","t.txt"]', `list: ${names}`)
  check(await sbx.files.exists('js/t.txt'), 'exists')
  check(!(await sbx.files.exists('js/nope')), 'not exists')
  const listed = await Sandbox.list().nextItems()
  check(listed.some((s) => s.sandboxId === sbx.sandboxId), 'Sandbox.list')
  // the server runs without --allow-internet-access: asking for the network is refused, naming the flag
  let refused = null
  try {
    const online = await Sandbox.create({ allowInternetAccess: true })
    await online.kill()
  } catch (err) {
    refused = err
  }
  check(refused instanceof SandboxError, `the network refused with a SandboxError, got ${refused}`)
  check(/^403: .*--allow-internet-access/.test(refused.message), `the refusal names the flag: ${refused.message}`)
} finally {
  await sbx.kill()
}
check(!(await sbx.isRunning()), 'killed')
console.log('ok')
