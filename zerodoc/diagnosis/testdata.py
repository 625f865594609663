"""`python -m zerodoc.diagnosis.testdata`: the old name of `python -m zerodoc.testing.rulecases`
(a rule case skeleton from a real run). The rule cases now live in `zerodoc.testing.rulecases`."""

if __name__ == "__main__":
    from ..cli.alias import run_alias
    from ..cli.rulecase import main

    run_alias("zerodoc.diagnosis.testdata", "python -m zerodoc.testing.rulecases", main)
