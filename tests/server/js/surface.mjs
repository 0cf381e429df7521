// The JavaScript SDK against `execspace serve` at the edges of its surface (tests/server/test_js_sdk.py runs it
// beside an `npm install e2b`): a killed command, a removed path that was not there, a directory's and a link's
// entry info, file metadata, a watch's events, and a sandbox killed under a running command; with
// EXECSPACE_MACHINE=1 (a root server's sandboxes are machines), the machine: `user` with its home and `sudo`, and the
// file API over /tmp and /etc. Prints "ok" when every check passed.
import { CommandExitError, FileType, Sandbox, TimeoutError } from 'e2b'

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`)
}

async function machine(sbx) {
  const ran = await sbx.commands.run('whoami; echo $HOME; pwd; sudo -n whoami')
  check(ran.stdout.split(/\s+/).filter(Boolean).join(',') === 'user,/home/user,/home/user,root', `who, got ${ran.stdout}`)
  await sbx.files.write('/tmp/m.txt', 't', { metadata: { k: 'tmp' } })
  check((await sbx.commands.run('cat /tmp/m.txt')).stdout === 't', 'a program reads what the file API wrote to /tmp')
  const info = await sbx.files.getInfo('/tmp/m.txt')
  check(info.path === '/tmp/m.txt' && info.size === 1 && info.metadata?.k === 'tmp', `/tmp's entry, got ${JSON.stringify(info)}`)
  check((await sbx.files.list('/tmp')).some((e) => e.name === 'm.txt'), '/tmp lists the file')
  await sbx.commands.run("sudo sh -c 'echo e > /etc/m-file'")
  check((await sbx.files.read('/etc/m-file')) === 'e\n', 'the file API reads what root wrote to /etc')
  const refused = await sbx.files.write('/etc/by-api', 'no').catch((e) => e)
  check(refused instanceof Error && /Permission denied/.test(refused.message), `the user may not write /etc, got ${refused}`)
}

const sbx = await Sandbox.create()
try {
  if (process.env.EXECSPACE_MACHINE === '1') await machine(sbx)
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
  const written = await sbx.files.write('d/m.txt', 'm', { metadata: { k: 'v' } })
  check(written.metadata?.k === 'v', `metadata written, got ${JSON.stringify(written.metadata)}`)
  const moved = await sbx.files.rename('d/m.txt', 'd/n.txt')
  check(moved.metadata?.k === 'v', `metadata kept by a rename, got ${JSON.stringify(moved.metadata)}`)
  const events = []
  const watch = await sbx.files.watchDir('d', (e) => events.push(e), { recursive: true, includeEntry: true })
  await sbx.files.write('d/e/w.txt', 'w')
  const deadline = Date.now() + 10000
  while (!events.some((e) => e.name === 'e/w.txt' && e.type === 'write') && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  await watch.stop()
  const kinds = events.filter((e) => e.name === 'e/w.txt').map((e) => e.type)
  check(kinds.join(',') === 'create,chmod,write', `an upload's events as envd's, got ${kinds}`)
  check(events.every((e) => e.entry?.path === `/home/user/d/${e.name}`), 'each event carries its entry')
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
