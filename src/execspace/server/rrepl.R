# execspace's R context (server/rcontext.py): runs each cell in the global environment, as R's own REPL would, and
# tells the server what is not plain output as records (server/recordprocess.py). `channel` is given by the
# bootstrap that read this text from it; each message on it is the cell's id, its code, then the names and values
# of its env vars.
local({
  cell <- ""
  pending <- list()
  max_text <- 4194304L  # recordprocess.MAX_TEXT: bytes of a text in a record

  hex <- function(text) {
    bytes <- charToRaw(enc2utf8(as.character(text)))
    if (length(bytes) > max_text) bytes <- c(bytes[seq_len(max_text)], charToRaw("\n[... cut]"))
    paste(as.character(bytes), collapse = "")
  }
  # A record of the running cell, sent at its end: a sink() the cell opened would take it before.
  record <- function(kind, ...) pending[[length(pending) + 1L]] <<- c(kind, vapply(c(...), hex, "", USE.NAMES = FALSE))
  write_record <- function(fields, to) {
    rest <- if (length(fields) > 1L) paste0(" ", fields[-1L], collapse = "") else ""
    line <- paste0("\036", cell, " ", fields[[1L]], rest, "\n")
    cat(line, file = to)
    flush(to)
  }
  # The cell's end: the sinks it left open closed (R's output goes to the server again), its records, then `done`
  # on both streams.
  finish <- function() {
    while (sink.number() > 0L) sink()
    if (sink.number(type = "message") != 2L) sink(type = "message")
    for (fields in pending) write_record(fields, stdout())
    pending <<- list()
    write_record("done", stdout())
    write_record("done", stderr())
  }
  field <- function(size) {
    bytes <- raw(0)
    while (length(bytes) < size) {
      more <- readBin(channel, "raw", size - length(bytes))
      if (length(more) == 0L) quit(save = "no", status = 0L)  # the server closed the channel
      bytes <- c(bytes, more)
    }
    bytes
  }
  text_field <- function() {
    text <- rawToChar(field(as.integer(rawToChar(field(10L)))))
    Encoding(text) <- "UTF-8"
    text
  }
  next_message <- function() {
    count <- as.integer(rawToChar(field(10L)))
    vapply(seq_len(count), function(i) text_field(), "")
  }

  render <- function(value) {
    shown <- utils::capture.output(if (isS4(value)) methods::show(value) else print(value))
    paste(shown, collapse = "\n")
  }
  # The driver's own calls: a condition of the cell's top level names one of them, which R's REPL would not show.
  own_calls <- list(quote(eval(expression, envir = globalenv())), quote(parse(text = code, keep.source = FALSE)))
  user_call <- function(call) if (any(vapply(own_calls, identical, NA, call))) NULL else call
  describe <- function(call) paste(deparse(call, nlines = 1L), collapse = "")
  # The calls from the cell's top level to where the condition was signalled, numbered as traceback() numbers them.
  stack <- function(calls) {
    top <- Position(function(call) identical(call, own_calls[[1L]]), calls, right = TRUE)
    if (is.na(top)) return(character(0))  # not the cell's code (a print method's): no trace
    calls <- calls[-seq_len(top)]
    calls <- head(calls, -1L)  # the handler's own
    if (length(calls) && identical(calls[[length(calls)]][[1L]], quote(.handleSimpleError))) calls <- head(calls, -1L)
    vapply(seq_along(calls), function(i) paste0(i, ". ", describe(calls[[i]])), "")
  }
  report <- function(condition, trace) {
    call <- user_call(conditionCall(condition))
    text <- conditionMessage(condition)
    head <- if (is.null(call)) paste0("Error: ", text) else paste0("Error in ", describe(call), " : ", text)
    lines <- if (length(trace)) c(head, "Traceback:", trace) else head
    record("error", class(condition)[[1L]], text, paste(lines, collapse = "\n"))
  }
  warn <- function(condition) {
    call <- user_call(conditionCall(condition))
    where <- if (is.null(call)) "" else paste0("In ", describe(call), " : ")
    cat("Warning message:\n", where, conditionMessage(condition), "\n", sep = "", file = stderr())
  }
  run_expression <- function(expression) withVisible(eval(expression, envir = globalenv()))

  # Runs `step` with the cell's handlers: a warning is shown at once (a script's would wait for its end), an error
  # is reported with the calls that led to it. FALSE after an error.
  guarded <- function(step) {
    trace <- character(0)
    tryCatch(
      # calling handlers run where the condition is signalled (sys.calls() is its stack), before tryCatch's
      withCallingHandlers({
        step()
        TRUE
      }, warning = function(w) {
        warn(w)
        invokeRestart("muffleWarning")
      }, error = function(e) trace <<- stack(sys.calls())),
      error = function(e) {
        report(e, trace)
        FALSE
      }
    )
  }
  # Each top-level expression in turn, as R's REPL: a visible value is shown (the last one is the cell's result);
  # the first error ends the cell.
  run <- function(code) {
    expressions <- tryCatch(parse(text = code, keep.source = FALSE), error = function(e) e)
    if (inherits(expressions, "error")) return(report(expressions, character(0)))
    last <- length(expressions)
    for (i in seq_len(last)) {
      shown <- text <- NULL
      if (!guarded(function() shown <<- run_expression(expressions[[i]]))) break
      if (!shown$visible) next
      if (!guarded(function() text <<- render(shown$value))) break
      record(if (i == last) "result" else "display", text)
    }
  }
  # The cell's env vars hold for it alone: what they replace is put back after it.
  with_env <- function(names, values, code) {
    saved <- if (length(names)) Sys.getenv(names, unset = NA, names = TRUE) else character(0)
    if (length(names)) do.call(Sys.setenv, as.list(stats::setNames(values, names)))
    on.exit(for (i in seq_along(names)) {
      if (is.na(saved[[i]])) Sys.unsetenv(names[[i]])
      else do.call(Sys.setenv, stats::setNames(list(saved[[i]]), names[[i]]))
    })
    run(code)
  }

  # An interrupt (SIGINT) stops the running cell; one that comes between cells is dropped (never R's own, which
  # would end a script).
  repeat {
    request <- NULL
    tryCatch(suspendInterrupts(request <- next_message()), interrupt = function(e) NULL)
    if (is.null(request)) next
    cell <- request[[1L]]
    pairs <- request[-(1:2)]
    tryCatch({
      tryCatch(Sys.sleep(0), interrupt = function(e) NULL)  # one meant for the last cell, come after its end
      with_env(pairs[c(TRUE, FALSE)], pairs[c(FALSE, TRUE)], request[[2L]])
    }, interrupt = function(e) record("error", "Interrupted", "the cell was interrupted", "Interrupted"))
    tryCatch(suspendInterrupts(finish()), interrupt = function(e) NULL)
  }
})
