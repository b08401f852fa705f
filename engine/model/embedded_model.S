/* The bundled stories260K model and tokenizer, included byte for byte. */
  .section .rodata
  .balign 64
  .global flexh2o_stories260k_model_begin
  .global flexh2o_stories260k_model_end
flexh2o_stories260k_model_begin:
  .incbin STORIES260K_MODEL
flexh2o_stories260k_model_end:
  .balign 64
  .global flexh2o_stories260k_tok_begin
  .global flexh2o_stories260k_tok_end
flexh2o_stories260k_tok_begin:
  .incbin STORIES260K_TOKENIZER
flexh2o_stories260k_tok_end:
  .section .note.GNU-stack,"",%progbits
