"""`python -m specdec_t5x.eval --gin_file=... [--gin.KEY=VALUE ...]`: the main job (see `cli`)."""

from specdec_t5x.eval import cli

if __name__ == "__main__":
    cli.run()
