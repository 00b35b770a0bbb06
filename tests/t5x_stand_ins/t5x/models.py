"""Stand-in for `t5x.models`: the class a user's model gin binds (never run here)."""


class EncoderDecoderModel:
    def __init__(self, module, input_vocabulary=None, output_vocabulary=None, **kwargs):
        self.module = module
