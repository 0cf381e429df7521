// The JavaScript SDK against `execspace serve` at the edges of its surface (tests/server/test_js_sdk.py runs it
// beside an `npm install e2b`): a killed command, a removed path that was not there, a directory's and a link's
// entry info, and a sandbox killed under a running command. Prints "ok" when every check passed.
import { CommandExitError, FileType, Sandbox, TimeoutError } from 'e2b'

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`)
}

const sbx = await Sandbox.create()
try {
  const cmd = await sbx.commands.run('sleep 60', { background: true })
  check(await cmd.kill(), 'kill says it killed')
  const killed = await cmd.wait().catch((e) => e)
  check(killed instanceof CommandExitError, `a killed command's wait throws CommandExitError, got ${killed}`)
  await sbx.files.remove('never-there.txt') // as envd: nothing to remove is no error
  await sbx.files.makeDir('d')
  const dir = await sbx.files.getInfo('d')
  check(dir.type === FileType.DIR && dir.size > 0, `a directory's own size, got ${dir.type} ${dir.size}`)
  await sbx.files.write('d/f.txt', 'x')
  await sbx.commands.run('ln -s f.txt link', { cwd: '/home/user/d' })
  const link = await sbx.files.getInfo('d/link')
  check(link.symlinkTarget === '/home/user/d/f.txt', `a link's resolved target, got ${link.symlinkTarget}`)
  check([FileType.FILE, 'symlink'].includes(link.type), `a link's type, got ${link.type}`)
} finally {
  await sbx.kill()
}

const doomed = await Sandbox.create()
const running = await doomed.commands.run('sleep 60', { background: true })
await doomed.kill()
const began = Date.now()
const gone = await running.wait().catch((e) => e)
check(gone instanceof TimeoutError, `a command of a killed sandbox throws TimeoutError, got ${gone}`)
check(gone.message.includes('sandbox was killed or reached its end of life'), `says so, got ${gone.message}`)
check(Date.now() - began < 5000, 'at once')
console.log('ok')
