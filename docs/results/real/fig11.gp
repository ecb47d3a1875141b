set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/real/fig11.png'
set title 'fig11: mean TPOT vs load, 8P16D, Llama-4-Maverick-17B-128E-Instruct (held out)'
set xlabel 'load (share of estimated capacity)'
set ylabel 'mean TPOT (ms)'
$d0 << EOD
0.2 4.85186
0.4 5.40839
0.6 5.93133
0.8 6.40596
0.95 6.71855
EOD
$d1 << EOD
0.2 4.77765
0.4 5.34916
0.6 5.88169
0.8 6.36375
0.95 6.68201
EOD
$d2 << EOD
0.2 4.77848
0.4 5.35033
0.6 5.88176
0.8 6.36312
0.95 6.6807
EOD
$d3 << EOD
0.2 4.79692
0.4 5.35676
0.6 5.88586
0.8 6.36515
0.95 6.68425
EOD
$d4 << EOD
0.2 4.77163
0.4 5.24594
0.6 5.67082
0.8 6.0422
0.95 6.28638
EOD
$d5 << EOD
0.2 4.82751
0.4 5.3918
0.6 5.91044
0.8 6.36145
0.95 6.64042
EOD
set key below
plot $d0 using 1:2 with linespoints lt 1 dt 1 title 'random', $d1 using 1:2 with linespoints lt 2 dt 1 title 'rr', $d2 using 1:2 with linespoints lt 3 dt 1 title 'jsq', $d3 using 1:2 with linespoints lt 4 dt 1 title 'p2c', $d4 using 1:2 with linespoints lt 5 dt 1 title 'eldr', $d5 using 1:2 with linespoints lt 6 dt 1 title 'eldr-permuted'
