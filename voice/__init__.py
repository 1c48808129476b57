"""Realtime media: Twilio Media Streams sessions, realtime model sessions and the
cascaded STT -> text model -> TTS pipeline. The only package that imports pipecat."""
