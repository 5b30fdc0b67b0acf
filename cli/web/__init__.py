"""pylog-console: a web console for operators (docs/console.md).

`reads` gathers what each page shows with the client library pylogctl uses; `history` keeps
the groups' lag over the last hour; `app` serves the pages (Starlette), each read in a thread
under the page's timeout; `cli.pylog_console` is the command that runs it (uvicorn).
"""
