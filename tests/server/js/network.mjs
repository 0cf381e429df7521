// The JavaScript SDK's egress rules against `execspace serve` (tests/server/test_network.py copies it next to an
// `npm install e2b` and runs it with the SDK's environment): allowOut/denyOut as the JS SDK sends them. Prints
// "ok" when every check passed.
import { ALL_TRAFFIC, Sandbox } from 'e2b'

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`)
}

const sbx = await Sandbox.create({ network: { allowOut: ['allowed.test'], denyOut: [ALL_TRAFFIC] } })
try {
  const got = await sbx.commands.run('curl -sS --max-time 20 http://allowed.test/')
  check(got.stdout === 'hello from 80\n', `allowed.test reached, got ${JSON.stringify(got.stdout)}`)
  const denied = await sbx.commands.run("curl -s -o /dev/null -w '%{http_code}' --max-time 20 http://denied.test/")
  check(denied.stdout === '403', `denied.test refused, got ${denied.stdout}`)
  const info = await sbx.getInfo()
  check(JSON.stringify(info.network?.allowOut) === '["allowed.test"]', `info allowOut ${JSON.stringify(info.network)}`)
} finally {
  await sbx.kill()
}
console.log('ok')
