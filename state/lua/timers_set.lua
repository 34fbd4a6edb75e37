#!lua flags=allow-oom
-- timers_set
--
-- The host's timers changed, landing even when Redis is full (it frees or moves):
-- lib/timers_set.lua says what it does. timers_grow is the same script without allow-oom.
--#include timers_set
