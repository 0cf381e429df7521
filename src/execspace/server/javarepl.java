// execspace's Java context (server/javacontext.py): runs each cell in one JShell whose snippets execute in this
// JVM (its "local" execution), so that System.out is this process's and variables, methods and classes carry over
// to the next cell. What is not plain output goes to the server as records (server/recordprocess.py): a value, an
// error, a cell's end, and each write of System.out and System.err as a piece of its own (as E2B's Java kernel
// shows them). Cells come on stdin (the cells' code reads nothing from System.in), each message the cell's id, its
// code, then the names and values of the system properties it sets for itself. The arguments name the
// environment variables that are also system properties (the sandbox's envVars, as E2B's kernel has them).

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.execution.LocalExecutionControl;
import jdk.jshell.spi.ExecutionControl;
import jdk.jshell.spi.ExecutionControlProvider;
import jdk.jshell.spi.ExecutionEnv;

class JavaRepl {
    /** Bytes of a text in a record (recordprocess.MAX_TEXT), and of one piece of output. */
    static final int MAX_TEXT = 4 * 1024 * 1024;
    static final int PIECE = 32 * 1024;
    /** The imports of the jshell tool's default start-up, which E2B's kernel has too. */
    static final String[] IMPORTS = {
        "java.io.*", "java.math.*", "java.net.*", "java.nio.file.*", "java.util.*", "java.util.concurrent.*",
        "java.util.function.*", "java.util.prefs.*", "java.util.regex.*", "java.util.stream.*",
    };
    static final Object NONE = new Object();

    static final FileOutputStream OUT = new FileOutputStream(FileDescriptor.out);
    static final FileOutputStream ERR = new FileOutputStream(FileDescriptor.err);
    /** The running cell's id, which its records (its output's too) carry. */
    static volatile String cell = "";
    static volatile boolean interrupted;

    public static void main(String[] args) throws Exception {
        for (String name : args) {
            String value = System.getenv(name);
            if (value != null) System.setProperty(name, value);
        }
        System.setIn(new ByteArrayInputStream(new byte[0]));
        System.setOut(new Pieces(OUT, "stdout"));
        System.setErr(new Pieces(ERR, "stderr"));
        JShell shell = JShell.builder().executionEngine(new Engine(), Map.of()).build();
        onInterrupt(() -> {
            interrupted = true;
            shell.stop();
        });
        for (String name : IMPORTS) shell.eval("import " + name + ";");
        DataInputStream channel = new DataInputStream(new FileInputStream(FileDescriptor.in));
        while (true) {
            List<String> request;
            try {
                request = next(channel);
            } catch (EOFException closed) {
                break;  // the server closed the channel
            }
            cell = request.get(0);
            interrupted = false;
            Map<String, String> saved = set(request.subList(2, request.size()));
            try {
                run(shell, request.get(1));
            } catch (Throwable e) {  // this driver's own failure: the cell's error, the context goes on
                record(OUT, "error", e.getClass().getSimpleName(), String.valueOf(e.getMessage()), trace(e));
            } finally {
                saved.forEach((name, value) -> {
                    if (value == null) System.clearProperty(name);
                    else System.setProperty(name, value);
                });
            }
            record(OUT, "done");
            record(ERR, "done");
        }
        Runtime.getRuntime().halt(0);  // threads the cells left running end with it
    }

    /** SIGINT runs {@code action} (it stops the running snippet and the threads it started) where the JVM's own
     *  handler would exit. sun.misc.Signal through reflection: named in the source, it costs a compiler warning on
     *  stderr at each start. */
    static void onInterrupt(Runnable action) throws ReflectiveOperationException {
        Class<?> signal = Class.forName("sun.misc.Signal");
        Class<?> handler = Class.forName("sun.misc.SignalHandler");
        Object onSignal = Proxy.newProxyInstance(handler.getClassLoader(), new Class<?>[] {handler}, (proxy, method, args) -> {
            if (method.getName().equals("handle")) action.run();
            return null;
        });
        Object interrupt = signal.getConstructor(String.class).newInstance("INT");
        signal.getMethod("handle", signal, handler).invoke(null, interrupt, onSignal);
    }

    static List<String> next(DataInputStream channel) throws IOException {
        int count = Integer.parseInt(new String(bytes(channel, 10), StandardCharsets.US_ASCII));
        List<String> fields = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            int size = Integer.parseInt(new String(bytes(channel, 10), StandardCharsets.US_ASCII));
            fields.add(new String(bytes(channel, size), StandardCharsets.UTF_8));
        }
        return fields;
    }

    static byte[] bytes(DataInputStream channel, int size) throws IOException {
        byte[] data = new byte[size];
        channel.readFully(data);
        return data;
    }

    /** Sets the cell's properties; what they replaced (null: unset), to put back after it. */
    static Map<String, String> set(List<String> pairs) {
        Map<String, String> saved = new HashMap<>();
        for (int i = 0; i + 1 < pairs.size(); i += 2) {
            saved.putIfAbsent(pairs.get(i), System.getProperty(pairs.get(i)));
            System.setProperty(pairs.get(i), pairs.get(i + 1));
        }
        return saved;
    }

    /** Each snippet of the cell in turn; the last one's value, if it is an expression's, is the cell's result. */
    static void run(JShell shell, String code) {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String result = null;
        String remaining = code;
        while (!interrupted) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            if (info.completeness() == SourceCodeAnalysis.Completeness.EMPTY) break;
            if (!info.completeness().isComplete()) {
                String rest = info.remaining().strip();
                record(OUT, "error", "IncompleteSourceException", rest, "Incomplete input:\n" + rest);
                return;
            }
            Engine.value = NONE;
            result = null;
            for (SnippetEvent event : shell.eval(info.source())) {
                if (event.causeSnippet() != null) continue;  // what a snippet changed of earlier ones
                if (interrupted) break;
                if (!failed(shell, event)) result = value(event);
                else return;
            }
            remaining = info.remaining();
        }
        if (interrupted) {
            record(OUT, "error", "Interrupted", "the cell was interrupted", "Interrupted");
        } else if (result != null) {
            record(OUT, "result", result);
        }
    }

    /** Whether the snippet failed (reported) rather than ran. */
    static boolean failed(JShell shell, SnippetEvent event) {
        JShellException thrown = event.exception();
        if (thrown instanceof EvalException) {
            EvalException e = (EvalException) thrown;
            String name = e.getExceptionClassName();
            String message = e.getMessage() == null ? "" : e.getMessage();
            String head = message.isEmpty() ? name : name + ": " + message;
            record(OUT, "error", name.substring(name.lastIndexOf('.') + 1), message, head + frames(e));
            return true;
        }
        if (thrown instanceof UnresolvedReferenceException) {
            String message = unresolved(shell, ((UnresolvedReferenceException) thrown).getSnippet());
            record(OUT, "error", "UnresolvedReferenceException", message, message);
            return true;
        }
        if (thrown != null) {
            record(OUT, "error", thrown.getClass().getSimpleName(), String.valueOf(thrown.getMessage()), trace(thrown));
            return true;
        }
        if (event.status() == Snippet.Status.REJECTED) {
            List<Diag> diagnostics = shell.diagnostics(event.snippet()).collect(Collectors.toList());
            String source = event.snippet().source();
            String value = diagnostics.stream().map(JavaRepl::message).collect(Collectors.joining("\n"));
            String shown = diagnostics.stream().map(d -> pointAt(source, d)).collect(Collectors.joining("\n"));
            record(OUT, "error", "CompilationException", value, shown.isEmpty() ? "rejected: " + source : shown);
            return true;
        }
        return false;
    }

    /** The text of an expression's value (the object's toString, an array as jshell shows it); null: none. */
    static String value(SnippetEvent event) {
        switch (event.snippet().subKind()) {
            case VAR_VALUE_SUBKIND:
            case OTHER_EXPRESSION_SUBKIND:
            case TEMP_VAR_EXPRESSION_SUBKIND:
                break;
            default:
                return null;
        }
        Object value = Engine.value;
        if (value == NONE) return event.value();  // not run here: jshell's own text of it
        if (value == null) return null;
        return value.getClass().isArray() ? event.value() : String.valueOf(value);
    }

    static String unresolved(JShell shell, Snippet snippet) {
        String names = snippet instanceof jdk.jshell.DeclarationSnippet
            ? shell.unresolvedDependencies((jdk.jshell.DeclarationSnippet) snippet).collect(Collectors.joining(", "))
            : "";
        return "a declaration this needs is not defined yet" + (names.isEmpty() ? "" : ": " + names);
    }

    static String pointAt(String source, Diag diagnostic) {
        int start = (int) Math.max(0, Math.min(diagnostic.getStartPosition(), source.length()));
        int lineStart = source.lastIndexOf('\n', start - 1) + 1;
        int lineEnd = source.indexOf('\n', start);
        String line = source.substring(lineStart, lineEnd < 0 ? source.length() : lineEnd);
        return line + "\n" + " ".repeat(start - lineStart) + "^\n" + message(diagnostic);
    }

    /** A diagnostic's message without its "location:" line (jshell's wrapper class, nameless). */
    static String message(Diag diagnostic) {
        return diagnostic.getMessage(null).lines()
            .filter(line -> !line.strip().startsWith("location:"))
            .collect(Collectors.joining("\n"));
    }

    /** The stack of a snippet's exception as the jshell tool shows it: jshell gave the cell's frames (and those it
     *  called) as "#snippet:line", without its own below them. */
    static String frames(Throwable e) {
        StringBuilder text = new StringBuilder();
        for (StackTraceElement frame : e.getStackTrace()) {
            text.append("\n\tat ");
            if (!frame.getClassName().isEmpty()) {
                text.append(frame);
                continue;
            }
            text.append(frame.getMethodName()).append(frame.getMethodName().isEmpty() ? "(" : " (");
            text.append(frame.getFileName()).append(':').append(frame.getLineNumber()).append(')');
        }
        return text.toString();
    }

    static String trace(Throwable e) {
        java.io.StringWriter text = new java.io.StringWriter();
        e.printStackTrace(new java.io.PrintWriter(text));
        return text.toString();
    }

    static void record(FileOutputStream to, String kind, String... fields) {
        byte[][] data = new byte[fields.length][];
        for (int i = 0; i < fields.length; i++) {
            byte[] bytes = fields[i].getBytes(StandardCharsets.UTF_8);
            if (bytes.length > MAX_TEXT) {
                byte[] cut = "\n[... cut]".getBytes(StandardCharsets.UTF_8);
                byte[] kept = java.util.Arrays.copyOf(bytes, MAX_TEXT + cut.length);
                System.arraycopy(cut, 0, kept, MAX_TEXT, cut.length);
                bytes = kept;
            }
            data[i] = bytes;
        }
        recordBytes(to, kind, data);
    }

    static final char[] HEX = "0123456789abcdef".toCharArray();

    static void recordBytes(FileOutputStream to, String kind, byte[]... fields) {
        StringBuilder line = new StringBuilder().append('\u001e').append(cell).append(' ').append(kind);
        for (byte[] field : fields) {
            line.append(' ');
            for (byte b : field) line.append(HEX[(b >> 4) & 0xf]).append(HEX[b & 0xf]);
        }
        byte[] bytes = line.append('\n').toString().getBytes(StandardCharsets.US_ASCII);
        synchronized (OUT) {
            try {
                to.write(bytes);
            } catch (IOException gone) {  // the server is gone: so is the context
                Runtime.getRuntime().halt(1);
            }
        }
    }

    /** System.out or System.err: each write a record of its own. A subclass, so that println is a print and a line
     *  end, two writes (PrintStream itself writes them as one), as E2B's Java kernel shows them. */
    static final class Pieces extends PrintStream {
        Pieces(FileOutputStream to, String kind) {
            super(new OutputStream() {
                @Override
                public void write(int b) {
                    write(new byte[] {(byte) b}, 0, 1);
                }

                @Override
                public void write(byte[] b, int off, int len) {
                    for (int at = off; at < off + len; at += PIECE) {
                        recordBytes(to, kind, java.util.Arrays.copyOfRange(b, at, Math.min(off + len, at + PIECE)));
                    }
                }
            }, true, StandardCharsets.UTF_8);
        }
    }

    /** jshell's local execution, keeping each snippet's value as an object (jshell itself gives only its text). */
    public static final class Engine implements ExecutionControlProvider {
        static volatile Method pending;
        static volatile Object value = NONE;

        @Override
        public String name() {
            return "execspace";
        }

        @Override
        public ExecutionControl generate(ExecutionEnv env, Map<String, String> parameters) throws Exception {
            Method trampoline = Engine.class.getMethod("trampoline");
            trampoline.setAccessible(true);
            return new LocalExecutionControl() {
                @Override
                protected String invoke(Method doit) throws Exception {
                    pending = doit;
                    return super.invoke(trampoline);  // on jshell's thread, which its stop() stops
                }
            };
        }

        public static Object trampoline() throws Throwable {
            try {
                Object found = pending.invoke(null);
                value = found;
                return found;
            } catch (InvocationTargetException e) {
                throw e.getCause();  // the snippet's own exception, as jshell expects it
            }
        }
    }
}
