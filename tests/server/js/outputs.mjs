// The JavaScript code-interpreter SDK reads serve's rich results (tests/server/test_outputs.py copies it next to an
// `npm install @e2b/code-interpreter` and runs it with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set): a chart,
// a DataFrame's data, an ESM import in a JavaScript context. Prints "ok" when every check passed.
import { Sandbox } from '@e2b/code-interpreter'

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`)
}

const sbx = await Sandbox.create()
try {
  const plot = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2], label='n')\nplt.title('Counts')\nplt.show()",
  )
  const chart = plot.results[0]?.chart
  check(chart && chart.type === 'bar' && chart.title === 'Counts', `a bar chart, got ${JSON.stringify(chart)}`)
  const bars = chart.elements.map((e) => `${e.label}=${e.value}/${e.group}`).join(' ')
  check(bars === 'a=1/n b=2/n', `its bars, got ${bars}`)
  check(plot.results[0].png, 'the chart comes with its PNG')
  const frame = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2, 3]})")
  const data = frame.results[0]?.data
  check(JSON.stringify(data) === '{"a":[1,2,3]}', `a DataFrame's data, got ${JSON.stringify(data)}`)
  const esm = await sbx.runCode("import { join } from 'path'\njoin('a', 'b')", { language: 'js' })
  check(esm.text === "'a/b'" || esm.text === 'a/b', `an ESM import, got ${JSON.stringify(esm)}`)
  console.log('ok')
} finally {
  await sbx.kill()
}
