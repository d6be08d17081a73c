"""The markspace package's own suite, run against agentpost.marks: its download and run
(`runner`), the known differences (`known`), and what the run puts first on its path
(`alias/`: the `markspace` alias package and the pytest plugin)."""
